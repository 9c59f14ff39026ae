#!/usr/bin/env python3
"""Two rules of the layout of `src/` that `make lint` checks (issue 31):

- the raw module API (`raw::RedisModule_*` and the crate's `raw::` helper functions) is called
  only under `src/host/` and in the entry point `src/lib.rs`;
- no source file is longer than 600 lines outside its test code (a trailing
  `#[cfg(test)] mod ...` block, or a file that is all tests, does not count).

    python3 tools/file_rules.py
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
LIMIT = 600
RAW_CALL = re.compile(r"\braw::(RedisModule_\w+|[a-z_]+\s*\()")


def code_lines(text: str) -> int:
    """Lines before the file's test module (a `#[cfg(test)]` followed by `mod`)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and re.match(
            r"\s*(pub\s+)?mod\s+\w+\s*(\{|;)", lines[i + 1]
        ):
            if lines[i + 1].rstrip().endswith("{"):
                return i
    return len(lines)


def main():
    problems = []
    for f in sorted(SRC.rglob("*.rs")):
        rel = f.relative_to(SRC)
        text = f.read_text()
        if rel.parts[0] != "host" and str(rel) != "lib.rs":
            for n, line in enumerate(text.splitlines(), 1):
                code = line.split("//", 1)[0]
                if RAW_CALL.search(code) and "std::os::raw" not in code:
                    problems.append(f"{rel}:{n}: raw module API outside host/: {line.strip()}")
        if rel.name.endswith("tests.rs") or rel.name == "tests.rs":
            continue
        n = code_lines(text)
        if n > LIMIT:
            problems.append(f"{rel}: {n} lines outside its tests (limit {LIMIT})")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"raw module API only under host/; no file over {LIMIT} lines outside tests")


if __name__ == "__main__":
    main()
