"""Oracle for the Parquet tests: pyarrow reads what rpg wrote and writes what rpg reads.

  dump FILE OUT.json              schema (column -> Arrow type string) and every row (to_pylist)
  write IN.json OUT.parquet VAR   writes rows (dicts in the paper's schema) with pyarrow;
                                  VAR: plain | null_split | large_string | row_groups | extra_columns
  bad OUT.parquet CASE            writes a file with one missing or mistyped column
"""
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def schema(string=pa.string(), split=pa.string()):
    return pa.schema([
        ("data_source", string),
        ("prompt", pa.list_(pa.struct([("content", string), ("role", string)]))),
        ("ability", string),
        ("reward_model", pa.struct([("ground_truth", string), ("style", string)])),
        ("extra_info", pa.struct([("index", pa.int64()), ("raw_problem", string), ("split", split)])),
    ])


def dump(path, out):
    t = pq.read_table(path)
    res = {"schema": {f.name: str(f.type) for f in t.schema}, "rows": t.to_pylist(), "num_rows": t.num_rows}
    with open(out, "w") as f:
        json.dump(res, f)


def write(inp, out, variant):
    rows = json.load(open(inp))
    if variant == "plain":
        t = pa.Table.from_pylist(rows, schema=schema())
        pq.write_table(t, out)
    elif variant == "null_split":
        for r in rows:
            r["extra_info"]["split"] = None
        pq.write_table(pa.Table.from_pylist(rows, schema=schema(split=pa.null())), out)
    elif variant == "large_string":
        pq.write_table(pa.Table.from_pylist(rows, schema=schema(string=pa.large_string(), split=pa.large_string())), out)
    elif variant == "row_groups":
        pq.write_table(pa.Table.from_pylist(rows, schema=schema()), out, row_group_size=3)
    elif variant == "extra_columns":
        t = pa.Table.from_pylist(rows, schema=schema())
        t = t.append_column("__index_level_0__", pa.array(range(t.num_rows), pa.int64()))
        t = t.append_column("note", pa.array(["x"] * t.num_rows))
        # columns in another order than ours
        t = t.select(["note", "extra_info", "reward_model", "__index_level_0__", "ability", "prompt", "data_source"])
        pq.write_table(t, out)
    else:
        raise SystemExit("unknown variant " + variant)


ROW = {
    "data_source": "math_dapo",
    "prompt": [{"content": "Solve 1+1.", "role": "user"}],
    "ability": "MATH",
    "reward_model": {"ground_truth": "2", "style": "rule-lighteval/MATH_v2"},
    "extra_info": {"index": 0, "raw_problem": "1+1", "split": None},
}


def bad(out, case):
    import copy

    rows = [copy.deepcopy(ROW) for _ in range(3)]
    s = schema()
    if case == "missing_prompt":
        s = s.remove(s.get_field_index("prompt"))
        for r in rows:
            del r["prompt"]
    elif case == "ground_truth_int":
        s = s.set(3, pa.field("reward_model", pa.struct([("ground_truth", pa.int64()), ("style", pa.string())])))
        for r in rows:
            r["reward_model"]["ground_truth"] = 2
    elif case == "index_string":
        s = s.set(4, pa.field("extra_info", pa.struct([("index", pa.string()), ("raw_problem", pa.string()), ("split", pa.string())])))
        for r in rows:
            r["extra_info"]["index"] = "0"
    elif case == "prompt_string":
        s = s.set(1, pa.field("prompt", pa.string()))
        for r in rows:
            r["prompt"] = "Solve 1+1."
    elif case == "data_source_int":
        s = s.set(0, pa.field("data_source", pa.int32()))
        for r in rows:
            r["data_source"] = 7
    elif case == "missing_raw_problem":
        s = s.set(4, pa.field("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])))
        for r in rows:
            del r["extra_info"]["raw_problem"]
    elif case == "null_ground_truth":
        rows[1]["reward_model"]["ground_truth"] = None
    elif case == "missing_role":
        s = s.set(1, pa.field("prompt", pa.list_(pa.struct([("content", pa.string())]))))
        for r in rows:
            del r["prompt"][0]["role"]
    else:
        raise SystemExit("unknown case " + case)
    pq.write_table(pa.Table.from_pylist(rows, schema=s), out)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "dump":
        dump(sys.argv[2], sys.argv[3])
    elif cmd == "write":
        write(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "bad":
        bad(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("unknown command " + cmd)
