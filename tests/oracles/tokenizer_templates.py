"""Chat templates for tests/tokenizer. QWEN25, QWEN3, LLAMA3 and LLAMA31 are the public
chat templates of Qwen2.5-Instruct, Qwen3, Meta-Llama-3-Instruct and Llama-3.1-Instruct
(as shipped in their tokenizer_config.json). CONSTRUCTS is a fixture that uses every
construct those templates use, plus the rest of the Jinja subset rpg supports:

  statements: if / elif / else, for (with loop.index, index0, first, last, length,
              revindex, revindex0, previtem, nextitem, cycle; `for a, b in ...`; `if` filter;
              else; break / continue), set (names, tuples, namespace attributes, blocks),
              macro with defaults, raw, comments, generation blocks
  whitespace: trim_blocks, lstrip_blocks, {%- -%} {{- -}} {#- -#}, {%+
  expressions: literals (strings with escapes, ints, floats, lists, tuples, dicts), ~ + - * / // % **,
              comparisons (chained), in / not in, and / or / not, conditional expressions,
              attribute and item access, slicing (messages[1:], [::-1], negative steps),
              string methods (strip, lstrip, rstrip, split, startswith, endswith, upper,
              lower, title, replace, find, count, join), dict methods (items, keys, values, get)
  filters:    trim, tojson (indent, sort_keys, separators), length, count, join, first, last,
              default, upper, lower, title, capitalize, replace, list, reverse, sort, unique,
              map, select, reject, selectattr, rejectattr, items, dictsort, indent, int,
              float, round, abs, sum, min, max, string, wordcount, safe
  tests:      defined, undefined, none, string, mapping, iterable, sequence, number,
              integer, float, boolean, true, false, callable, even, odd, divisibleby,
              equalto, eq, ne, lt, gt, in, sameas
  globals:    namespace, range, raise_exception, dict
"""

QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

LLAMA31 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

CONSTRUCTS = r"""{#- A fixture: every construct of the supported subset, rendered against jinja2. -#}
{%- macro render_msg(m, prefix='> ', upper=false) -%}
{{ prefix }}{{ m.role | upper if upper else m.role }}: {{ m.content | trim }}
{%- endmacro %}
{% set ns = namespace(count=0, roles=[], total=0) %}
{%- set sep, mark = ' | ', "*" %}
{%- set header %}[{{ messages | length }} messages]{% endset %}
{{ header }}
{%+ if add_generation_prompt %}gen{% else %}nogen{% endif %}
    {% for m in messages if m.role != 'tool' %}
    {{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} {{ loop.revindex0 }} {{ loop.first }} {{ loop.last }} {{ loop.cycle('odd', 'even') }}
    {{- ' prev=' ~ (loop.previtem.role if loop.previtem is defined else '-') ~ ' next=' ~ (loop.nextitem.role if loop.nextitem is defined else '-') }}
    {{ render_msg(m) }}|{{ render_msg(m, prefix='# ', upper=true) }}
    {%- set ns.count = ns.count + 1 %}
    {%- set ns.roles = ns.roles + [m.role] %}
    {%- set ns.total = ns.total + (m.content | length) %}
    {%- if m.content is string and m.content.startswith('stop') %}{% break %}{% endif %}
    {%- if m.role == 'system' %}{% continue %}{% endif %}
    {{ m.content[:5] }}|{{ m.content[-3:] }}|{{ m.content[::2] }}|{{ m.content[::-1] }}|{{ m.content[1:-1:3] }}
    {{ m.content.strip() }}|{{ m.content.lstrip(' ab') }}|{{ m.content.rstrip('!? ') }}|{{ m.content.split() }}|{{ m.content.split(' ', 1) }}
    {{ m.content.upper() }}|{{ m.content.lower() }}|{{ m.content.title() }}|{{ m.content.replace('a', 'A') }}|{{ m.content.find('e') }}|{{ m.content.count('e') }}
    {{ m.content | wordcount }} {{ m.content | capitalize }} {{ m.content | reverse }} {{ m.content | list | first }} {{ m.content | list | last }}
    {{ '-'.join(m.content.split()) }} {{ m.content.endswith('?') }} {{ 'x' in m.content }} {{ 'x' not in m.content }}
    {% else %}
    no messages
    {% endfor %}
count={{ ns.count }} roles={{ ns.roles | join(sep) }} total={{ ns.total }} unique={{ ns.roles | unique | list }} sorted={{ ns.roles | sort(reverse=true) }}
{{ messages | map(attribute='role') | join(',') }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }}
{{ [3, 1, 2] | sort }} {{ [1, 2, 3, 4, 5, 6] | select('even') | list }} {{ [1, 2, 3, 4, 5, 6] | reject('odd') | list }} {{ [1, 2, 3] | sum }} {{ [4, 2, 9] | min }} {{ [4, 2, 9] | max }}
{{ range(5) | list }} {{ range(2, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ [1, 2, 3] | map('string') | join('+') }}
{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 / 3 }} {{ 0.1 + 0.2 }} {{ 1e20 * 10 }} {{ 1.5e-7 }} {{ 3 * 'ab' }} {{ [0] * 3 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }}
{{ 'a' ~ 1 ~ none ~ true }} {{ none }} {{ true }} {{ false }} {{ 42 | string }} {{ '42' | int + 1 }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.675 | round(2) }} {{ 2.5 | round }} {{ 7 | float }} {{ 'abc' | int }}
{{ {'b': 1, 'a': [1, 2.5, none, true, 'x"y']} }} {{ ('a', 1) }} {{ ['it\'s', "say \"hi\"", 'tab\there', 'nl\nx', 'é€😀'] }}
{{ {'b': 1, 'a': {'z': [1, 2], 'y': 'é'}} | tojson }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ [1, {'k': 'v'}] | tojson(indent=2) }} {{ {'a': 1} | tojson(separators=[',', ':']) }} {{ 'é\u00e9\x41\101\n' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }}
{{ {'b': 2, 'a': 1} | dictsort }} {{ {'b': 2, 'a': 1} | items | list }} {% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }};{% endfor %} {{ {'x': 1}.keys() | list }} {{ {'x': 1}.values() | list }} {{ {'x': 1}.get('x') }} {{ {'x': 1}.get('y', 'dflt') }}
{{ undefined_var | default('dflt') }} {{ '' | default('empty', true) }} {{ undefined_var is defined }} {{ undefined_var is undefined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 'x' is sequence }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ true is true }} {{ 0 is false }} {{ namespace is callable }}
{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 3 is gt 2 }} {{ 'a' is in 'abc' }} {{ none is sameas none }} {{ 2 is not odd }}
{{ 'yes' if messages else 'no' }} {{ 'a' if false }}|{{ (1, 2)[1] }} {{ [1, 2, 3][-1] }} {{ 'abc'[1] }} {{ messages[0]['role'] }} {{ messages[0].role }} {{ messages[-1].content | length }}
{{ "line1\nline2\n\nline4" | indent(2) }}|{{ "a\nb" | indent(4, true) }}|{{ 'hello world' | title }}|{{ 'Hello' | lower }}|{{ 'hello' | replace('l', 'L', 1) }}|{{ '  x  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ '<b>' | safe }}
{% raw %}{{ not rendered }} {% if %}{% endraw %}
{{- '  spaced  ' -}}
   {#- comment -#}   |
{% if tools is not none and tools | length > 0 %}tools: {% for t in tools %}{{ t.function.name }}({{ t.function.parameters.properties | list | join(', ') }}){{ ', ' if not loop.last }}{% endfor %}{% endif %}
{% generation %}gen-block {{ messages | length }}{% endgeneration %}
{%- if messages | length > 99 %}{{ raise_exception('too many messages: ' ~ messages | length) }}{% endif %}
"""

TEMPLATES = {"qwen25": QWEN25, "qwen3": QWEN3, "llama3": LLAMA3, "llama31": LLAMA31, "constructs": CONSTRUCTS}
