#include "rpg/data/synth.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <numeric>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/rng.h"
#include "rpg/data/dataset.h"
#include "rpg/data/prepare.h"

namespace rpg::data {
namespace {

namespace fs = std::filesystem;
using std::to_string;

// Uniform integer in [lo, hi] by rejection: std::uniform_int_distribution's output differs
// between standard libraries, which would break "same seed, same files everywhere".
int64_t draw(RandomStream& rs, int64_t lo, int64_t hi) {
  const uint64_t bound = static_cast<uint64_t>(hi - lo) + 1, limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do x = rs.next_u64();
  while (x >= limit);
  return lo + static_cast<int64_t>(x % bound);
}

template <class T, size_t N>
const T& pick(RandomStream& rs, const std::array<T, N>& items) {
  return items[static_cast<size_t>(draw(rs, 0, static_cast<int64_t>(N) - 1))];
}

// What deduplication compares: the mathematical content, so that two phrasings of the same
// sum cannot land in different splits.
struct Generated {
  SynthProblem problem;
  std::string signature;
};

std::string frac_text(int64_t num, int64_t den) { return den == 1 ? to_string(num) : to_string(num) + "/" + to_string(den); }

// num/den in lowest terms with the sign on the numerator, as Python's str(Fraction) writes it.
std::string canonical_frac(int64_t num, int64_t den) {
  int64_t g = std::gcd(num, den);
  if (den < 0) g = -g;
  return frac_text(num / g, den / g);
}

std::string ask_value(RandomStream& rs, const std::string& expr) {
  switch (draw(rs, 0, 2)) {
    case 0: return "What is " + expr + "?";
    case 1: return "Compute " + expr + ".";
    default: return "Evaluate " + expr + ".";
  }
}

// Level 0: a + b + c over one-digit numbers, one addition per line (the level-2 layout).
// Small enough for a 1M-parameter model to learn in minutes, and compositional: a held-out
// triple is made of the same one-digit additions as the training triples.
Generated three_digit_sum(RandomStream& rs) {
  const int64_t a = draw(rs, 0, 9), b = draw(rs, 0, 9), c = draw(rs, 0, 9);
  const std::string expr = to_string(a) + " + " + to_string(b) + " + " + to_string(c),
                    answer = to_string(a + b + c);
  const std::string solution = expr + "\n= " + to_string(a + b) + " + " + to_string(c) + "\n= " + answer +
                               "\nAnswer: " + answer;
  return {{ask_value(rs, expr), answer, solution, 0}, "0:" + expr};
}

Generated one_operation(RandomStream& rs) {
  const char op = pick(rs, std::array{'+', '-', '*', '/'});
  int64_t a, b, r;
  switch (op) {
    case '+': a = draw(rs, 10, 99), b = draw(rs, 10, 99), r = a + b; break;
    case '-': a = draw(rs, 10, 99), b = draw(rs, 10, 99), r = a - b; break;
    case '*': a = draw(rs, 2, 12), b = draw(rs, 2, 25), r = a * b; break;
    default: b = draw(rs, 2, 12), r = draw(rs, 2, 15), a = b * r; break;  // exact division
  }
  const std::string expr = to_string(a) + " " + op + " " + to_string(b), answer = to_string(r);
  return {{ask_value(rs, expr), answer, expr + " = " + answer + ".\nAnswer: " + answer, 1}, "1:" + expr};
}

// Level 6: a one-digit number added to one below 100, always asked "What is a + b?" (the
// phrasing of the few-shot prompt's worked examples, which are never drawn themselves).
Generated add_one_digit(RandomStream& rs) {
  int64_t a, b;
  do {
    a = draw(rs, 1, 99), b = draw(rs, 1, 9);
  } while ((a == kFewShotExamples[0].a && b == kFewShotExamples[0].b) ||
           (a == kFewShotExamples[1].a && b == kFewShotExamples[1].b));
  const std::string expr = to_string(a) + " + " + to_string(b), answer = to_string(a + b);
  return {{"What is " + expr + "?", answer, expr + " = " + answer + ".\nAnswer: " + answer, 6}, "6:" + expr};
}

// Level 2: a random expression tree over + - * whose text needs parentheses. The worked
// solution reduces one operation per line, innermost-left first, so every line is an
// equal expression that a checker can evaluate.
struct Node {
  char op = 0;  // 0: a number
  int64_t value = 0;
  int left = -1, right = -1;
};

int precedence(char op) { return op == '*' ? 2 : 1; }

int build_tree(RandomStream& rs, std::vector<Node>& nodes, int ops) {
  if (ops == 0) {
    nodes.push_back({0, draw(rs, 1, 12), -1, -1});
    return static_cast<int>(nodes.size()) - 1;
  }
  const int left_ops = static_cast<int>(draw(rs, 0, ops - 1));
  const int l = build_tree(rs, nodes, left_ops), r = build_tree(rs, nodes, ops - 1 - left_ops);
  nodes.push_back({pick(rs, std::array{'+', '-', '*'}), 0, l, r});
  return static_cast<int>(nodes.size()) - 1;
}

// The value, and the largest magnitude of any intermediate result (keeps the arithmetic
// within what a small model can learn).
int64_t evaluate(const std::vector<Node>& nodes, int i, int64_t& largest) {
  const Node& n = nodes[static_cast<size_t>(i)];
  int64_t v = n.value;
  if (n.op) {
    const int64_t a = evaluate(nodes, n.left, largest), b = evaluate(nodes, n.right, largest);
    v = n.op == '+' ? a + b : n.op == '-' ? a - b : a * b;
  }
  largest = std::max(largest, std::abs(v));
  return v;
}

std::string render(const std::vector<Node>& nodes, int i) {
  const Node& n = nodes[static_cast<size_t>(i)];
  if (!n.op) return n.value < 0 ? "(" + to_string(n.value) + ")" : to_string(n.value);
  auto side = [&](int c, bool right) {
    const Node& cn = nodes[static_cast<size_t>(c)];
    const bool paren = cn.op && (precedence(cn.op) < precedence(n.op) ||
                                 (right && precedence(cn.op) == precedence(n.op) && n.op == '-'));
    return paren ? "(" + render(nodes, c) + ")" : render(nodes, c);
  };
  return side(n.left, false) + " " + n.op + " " + side(n.right, true);
}

// The first operation in post-order whose operands are both numbers.
int next_reduction(const std::vector<Node>& nodes, int i) {
  const Node& n = nodes[static_cast<size_t>(i)];
  if (nodes[static_cast<size_t>(n.left)].op) return next_reduction(nodes, n.left);
  if (nodes[static_cast<size_t>(n.right)].op) return next_reduction(nodes, n.right);
  return i;
}

Generated multi_step(RandomStream& rs) {
  constexpr int kTries = 1000;  // a random tree needs parentheses about half the time
  for (int attempt = 0; attempt < kTries; ++attempt) {
    std::vector<Node> nodes;
    const int root = build_tree(rs, nodes, static_cast<int>(draw(rs, 2, 3)));
    int64_t largest = 0;
    const int64_t value = evaluate(nodes, root, largest);
    const std::string expr = render(nodes, root);
    if (largest > 200 || expr.find('(') == std::string::npos) continue;
    std::string solution = expr;
    for (;;) {
      const int i = next_reduction(nodes, root);
      Node& n = nodes[static_cast<size_t>(i)];
      int64_t unused = 0;
      n.value = evaluate(nodes, i, unused);
      n.op = 0;
      if (i == root) break;
      solution += "\n= " + render(nodes, root);
    }
    const std::string answer = to_string(value);
    solution += "\n= " + answer + "\nAnswer: " + answer;
    return {{ask_value(rs, expr), answer, solution, 2}, "2:" + expr};
  }
  throw ValueError(str("data synth: no level-2 expression with parentheses after ", kTries, " tries"));
}

Generated linear_equation(RandomStream& rs) {
  const int64_t a = draw(rs, 2, 12) * (draw(rs, 0, 1) ? 1 : -1), x = draw(rs, -15, 15);
  const int64_t b = draw(rs, 1, 40) * (draw(rs, 0, 1) ? 1 : -1), c = a * x + b;
  const std::string v(1, pick(rs, std::array{'x', 'y', 'n'}));
  const std::string lhs = to_string(a) + v + (b < 0 ? " - " : " + ") + to_string(std::abs(b));
  const std::string equation = lhs + " = " + to_string(c), answer = to_string(x);
  std::string solution = equation + "\n";
  solution += (b > 0 ? "Subtract " : "Add ") + to_string(std::abs(b)) + (b > 0 ? " from" : " to") +
              " both sides: " + to_string(a) + v + " = " + to_string(c - b) + ".\n";
  solution += "Divide both sides by " + to_string(a) + ": " + v + " = " + answer + ".\nAnswer: " + answer;
  return {{"Solve for " + v + ": " + equation + ".", answer, solution, 3},
          str("3:", a, ",", b, ",", c)};
}

std::string digits_of(const std::string& number, const char* sep) {
  std::string out;
  for (size_t i = 0; i < number.size(); ++i) {
    if (i) out += sep;
    out += number[i];
  }
  return out;
}

Generated digit_problem(RandomStream& rs) {
  const int64_t kind = draw(rs, 0, 2);
  std::string number, solution, problem;
  if (kind == 2) {
    const int64_t n = draw(rs, 3, 4);
    // Digits 1..9 only: one zero would make every product 0.
    for (int64_t i = 0; i < n; ++i) number += static_cast<char>('0' + draw(rs, 1, 9));
    int64_t product = 1;
    for (char d : number) product *= d - '0';
    const std::string answer = to_string(product);
    problem = "What is the product of the digits of " + number + "?";
    solution = "The digits of " + number + " are " + digits_of(number, ", ") + ".\n" + digits_of(number, " * ") +
               " = " + answer + ".\nAnswer: " + answer;
    return {{problem, answer, solution, 4}, "4p:" + number};
  }
  std::string signature;
  if (kind == 0) {
    const int64_t n = draw(rs, 4, 7);
    number += static_cast<char>('0' + draw(rs, 1, 9));
    for (int64_t i = 1; i < n; ++i) number += static_cast<char>('0' + draw(rs, 0, 9));
    problem = "What is the sum of the digits of " + number + "?";
    signature = "4s:" + number;
  } else {
    const int64_t a = draw(rs, 11, 99), b = draw(rs, 11, 99);
    number = to_string(a * b);
    const std::string expr = to_string(a) + " * " + to_string(b);
    problem = "What is the sum of the digits of " + expr + "?";
    solution = expr + " = " + number + ".\n";
    signature = "4m:" + expr;
  }
  int64_t sum = 0;
  for (char d : number) sum += d - '0';
  const std::string answer = to_string(sum);
  solution += "The digits of " + number + " are " + digits_of(number, ", ") + ".\n" + digits_of(number, " + ") +
              " = " + answer + ".\nAnswer: " + answer;
  return {{problem, answer, solution, 4}, signature};
}

Generated fraction_problem(RandomStream& rs) {
  auto proper = [&](int64_t& p, int64_t& q) {
    q = draw(rs, 2, 12);
    do p = draw(rs, 1, q - 1);
    while (std::gcd(p, q) != 1);
  };
  int64_t p1, q1, p2, q2;
  proper(p1, q1);
  proper(p2, q2);
  const char op = pick(rs, std::array{'+', '-', '*'});
  const std::string expr = frac_text(p1, q1) + " " + op + " " + frac_text(p2, q2);
  int64_t num, den;
  std::string steps = expr;
  if (op == '*') {
    num = p1 * p2, den = q1 * q2;
    steps += str(" = (", p1, " * ", p2, ")/(", q1, " * ", q2, ")");
  } else {
    den = std::lcm(q1, q2);
    const int64_t n1 = p1 * (den / q1), n2 = p2 * (den / q2);
    if (q1 != den || q2 != den) steps += " = " + frac_text(n1, den) + " " + op + " " + frac_text(n2, den);
    num = op == '+' ? n1 + n2 : n1 - n2;
  }
  const std::string raw = to_string(num) + "/" + to_string(den), answer = canonical_frac(num, den);
  steps += " = " + raw;
  if (answer != raw) steps += " = " + answer;
  return {{"What is " + expr + "? Write the answer in lowest terms.", answer, steps + ".\nAnswer: " + answer, 5},
          "5:" + expr};
}

Generated generate(int difficulty, uint64_t key) {
  RandomStream rs(key);
  switch (difficulty) {
    case 0: return three_digit_sum(rs);
    case 1: return one_operation(rs);
    case 2: return multi_step(rs);
    case 3: return linear_equation(rs);
    case 4: return digit_problem(rs);
    case 5: return fraction_problem(rs);
    case 6: return add_one_digit(rs);
    default:
      throw ValueError(str("data synth: difficulty ", difficulty, " is outside ", kSynthMinDifficulty, "..",
                           kSynthMaxDifficulty));
  }
}

// Fixed per split, so that the streams do not depend on the order the splits are listed in.
constexpr uint64_t kTestStream = 0x7465737400000001ull, kValidationStream = 0x76616c6900000002ull,
                   kTrainStream = 0x747261696e000003ull, kOrderStream = 0x6f72646572000004ull;

void fill_split(std::vector<SynthProblem>& out, int64_t n, uint64_t split_key, const SynthOptions& options,
                std::unordered_set<std::string>& seen, const char* name) {
  // Each slot redraws until it finds an unseen problem; a level whose problems are used up
  // fails after this many redraws instead of looping for ever.
  constexpr int kAttempts = 1000;
  const int levels = options.max_difficulty - options.min_difficulty + 1;
  out.reserve(static_cast<size_t>(n));
  std::vector<SynthProblem> drawn;
  drawn.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int difficulty = options.min_difficulty + static_cast<int>(i % levels);
    for (int attempt = 0;; ++attempt) {
      if (attempt == kAttempts)
        throw ValueError(str("data synth: ran out of distinct level-", difficulty, " problems at ", name, " problem ",
                             i + 1, " (ask for fewer problems or more levels)"));
      Generated g = generate(difficulty, mix_key(split_key, static_cast<uint64_t>(i), static_cast<uint64_t>(attempt)));
      if (seen.insert(std::move(g.signature)).second) {
        drawn.push_back(std::move(g.problem));
        break;
      }
    }
  }
  for (int64_t j : random_permutation(n, mix_key(split_key, kOrderStream))) out.push_back(std::move(drawn[static_cast<size_t>(j)]));
}

}  // namespace

SynthProblem synth_problem(int difficulty, uint64_t key) { return generate(difficulty, key).problem; }

SynthSplits synth_splits(const SynthOptions& options) {
  if (options.min_difficulty < kSynthMinDifficulty || options.max_difficulty > kSynthMaxDifficulty ||
      options.min_difficulty > options.max_difficulty)
    throw ValueError(str("data synth: difficulties ", options.min_difficulty, "..", options.max_difficulty,
                         " must lie within ", kSynthMinDifficulty, "..", kSynthMaxDifficulty, " with min <= max"));
  constexpr int64_t kMaxProblems = 10'000'000;
  for (auto [name, n] : {std::pair{"train", options.train}, std::pair{"validation", options.validation},
                         std::pair{"test", options.test}})
    if (n < 1 || n > kMaxProblems)
      throw ValueError(str("data synth: ", name, " size ", n, " is outside 1..", kMaxProblems));
  SynthSplits out;
  std::unordered_set<std::string> seen;
  fill_split(out.test, options.test, mix_key(options.seed, kTestStream), options, seen, "test");
  fill_split(out.validation, options.validation, mix_key(options.seed, kValidationStream), options, seen, "validation");
  fill_split(out.train, options.train, mix_key(options.seed, kTrainStream), options, seen, "train");
  return out;
}

std::string synth_parquet_name(const std::string& split) { return split + ".parquet"; }
std::string synth_sft_name(const std::string& split) { return split + "_sft.jsonl"; }

std::string synth_sft_jsonl(const std::vector<SynthProblem>& problems) {
  std::string out;
  for (const auto& p : problems) {
    nlohmann::ordered_json j = {{"prompt", apply_prompt_template(p.problem)},
                                {"response", p.solution},
                                {"problem", p.problem},
                                {"answer", p.answer},
                                {"difficulty", p.difficulty}};
    out += j.dump();
    out += '\n';
  }
  return out;
}

void write_synth(const fs::path& out_dir, const SynthSplits& splits, const SynthWriteOptions& options) {
  if (options.repeat_test < 1) throw ValueError(str("data synth: repeat_test ", options.repeat_test, " must be >= 1"));
  if (options.data_source.empty()) throw ValueError("data synth: data_source must not be empty");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw IoError(str("cannot create directory ", out_dir.string(), ": ", ec.message()));
  for (auto [name, problems, repeat] : {std::tuple{"train", &splits.train, int64_t{1}},
                                        std::tuple{"validation", &splits.validation, int64_t{1}},
                                        std::tuple{"test", &splits.test, options.repeat_test}}) {
    std::vector<ProblemRecord> records;
    records.reserve(problems->size());
    for (const auto& p : *problems) records.push_back({p.problem, p.answer});
    PrepareOptions prepare;
    prepare.data_source = options.data_source;
    prepare.split = name;
    prepare.repeat = repeat;
    prepare.prompt_style = options.prompt_style;
    write_parquet(out_dir / synth_parquet_name(name), prepare_rows(records, prepare));
    write_file_atomic(out_dir / synth_sft_name(name), synth_sft_jsonl(*problems));
  }
}

}  // namespace rpg::data
