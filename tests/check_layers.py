#!/usr/bin/env python3
"""Fails when a source file includes a header from a layer above its own.

The layers, bottom up (docs/architecture.md):

    csrc -> parallel -> optim -> offload -> zero -> engine/config -> engine (launch, estimator, the Engine)
         -> engine/planner -> engine/cli -> python/csrc

A file may include headers of its own part and of parts strictly below it; parts on the same level
(engine/launch, engine/estimator and the Engine itself) do not include each other. The CMake
targets link the same way, but one include path serves them all, so an upward #include of a
header-only type would still compile: this check is what stops it. The library never includes
examples/, tests/ or bench/.

    tests/check_layers.py [ROOT]     (ROOT: the repository, default: this file's parent's parent)
"""
import os
import re
import sys

# (path prefix, level, name); the longest matching prefix wins.
PARTS = [
    ("csrc/", 0, "csrc"),
    ("parallel/", 1, "parallel"),
    ("optim/", 2, "optim"),
    ("offload/", 3, "offload"),
    ("zero/", 4, "zero"),
    ("engine/config/", 5, "engine/config"),
    ("engine/launch/", 6, "engine/launch"),
    ("engine/estimator/", 6, "engine/estimator"),
    ("engine/", 6, "engine"),
    ("engine/planner/", 7, "engine/planner"),
    ("engine/cli/", 8, "engine/cli"),
    ("python/csrc/", 9, "python"),
]
OUTSIDE = ("examples/", "tests/", "bench/")  # programs built on the library
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def part_of(path):
    best = None
    for prefix, level, name in PARTS:
        if path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, level, name)
    return best


def violations(root):
    found = []
    for prefix, _, _ in PARTS:
        top = os.path.join(root, prefix)
        if not os.path.isdir(top):
            continue
        for dirpath, _, files in os.walk(top):
            for f in sorted(files):
                if not f.endswith((".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                here = part_of(path)
                if here[0] != prefix:
                    continue  # walked from a shorter prefix; the longer one owns it
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as text:
                    for number, line in enumerate(text, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if target.startswith(OUTSIDE):
                            found.append("%s:%d: includes %s: the library never includes %s"
                                         % (path, number, target, target.split("/")[0] + "/"))
                            continue
                        there = part_of(target)
                        if there is None or there[2] == here[2]:
                            continue  # a system/third-party header, or its own part
                        if there[1] >= here[1]:
                            found.append("%s:%d: %s includes %s, from %s, which is %s it"
                                         % (path, number, here[2], target, there[2],
                                            "on the same level as" if there[1] == here[1] else "above"))
    return found


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = violations(root)
    for v in bad:
        print(v)
    if bad:
        print("check_layers: %d include(s) against the layer order "
              "csrc -> parallel -> optim -> zero -> engine -> python" % len(bad))
        return 1
    print("check_layers: every #include goes downward")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
