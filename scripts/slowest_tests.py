#!/usr/bin/env python3
"""The slowest tests of a `make test` run, from the JUnit XML files ctest and pytest wrote.

    slowest_tests.py [-n 10] FILE.xml ...

Prints one line per test, slowest first, with its runner and seconds, and the total of each file,
so that a change sees what its tests cost (scripts/test.sh calls it at the end), then one closing
line over every file: "tests: N passed, N failed, N skipped". Files that do not exist are skipped
(a runner that did not get to write one).
"""
import argparse
import os
import sys
import xml.etree.ElementTree as ET


def outcome(case):
    tags = {child.tag for child in case}
    if tags & {"failure", "error"}:
        return "failed"
    if "skipped" in tags or case.get("status") in ("notrun", "disabled"):
        return "skipped"
    return "passed"


def cases(path):
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        if case.get("classname") and case.get("classname") not in name:
            name = f"{case.get('classname')}::{name}"
        try:
            seconds = float(case.get("time", "0"))
        except ValueError:
            seconds = 0.0
        yield name, seconds, outcome(case)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    rows, totals = [], []
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for path in args.files:
        if not os.path.exists(path):
            continue
        runner = os.path.basename(path).split("-")[0].split(".")[0]
        found = list(cases(path))
        totals.append((runner, len(found), sum(t for _, t, _ in found)))
        rows += [(t, runner, name) for name, t, _ in found]
        for _, _, result in found:
            counts[result] += 1
    if not rows:
        print("[test] no timings found")
        return 0
    print(f"[test] the {min(args.n, len(rows))} slowest tests:")
    for seconds, runner, name in sorted(rows, reverse=True)[: args.n]:
        print(f"  {seconds:8.1f} s  {runner:6s} {name}")
    for runner, count, seconds in totals:
        print(f"  {runner}: {count} tests, {seconds:.0f} s")
    print(f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
