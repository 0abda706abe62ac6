"""Docs that run: every fenced block of the documents in DOCUMENTS, run as a reader would after the
two commands (`make demo`, `make test`) and `source scripts/env.sh`, so the docs cannot drift.

- ```sh: run by bash (set -e, pipefail) from the checkout, after `source scripts/env.sh`;
- ```python: written to a file and run with the venv's python from the checkout;
- ```json: a training config, checked with `tessera config check` (it must pass);
- untagged blocks are output samples, and are not run.
Step counts shrink to 2 (`--steps N`), so every block runs in seconds. A block in another language
(cpp, cmake), or one that cannot run here, carries a directive on the line before its fence:
  <!-- doc-test: skip: why (or which test runs it) -->
  <!-- doc-test: expect-errors -->  a json config that must fail with every `error:` line of the
                                    next untagged (output) block
A block without a directive in a language that does not run fails the test: say why it is not run.
"""
import os
import re
import subprocess
import tempfile

import pytest

from conftest import ROOT


DOCUMENTS = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
RUN = {"sh", "python", "json"}
FENCE = re.compile(r"^\s*```(\S*)\s*$")  # indented fences (in lists) too
DIRECTIVE = re.compile(r"^<!--\s*doc-test:\s*([\w-]+)\s*(?::\s*(.*?))?\s*-->\s*$")


def blocks(document):
    """(line, language, text, directive, reason, the next untagged block's text) per fenced block."""
    lines = open(os.path.join(ROOT, document)).read().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, language = i, m.group(1)
        j = i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        d = DIRECTIVE.match(lines[start - 1]) if start > 0 else None
        found.append([start + 1, language, "\n".join(lines[start + 1:j]), d.group(1) if d else None,
                      d.group(2) if d else None, None])
        i = j + 1
    for k, b in enumerate(found):  # the output a block's directive may refer to
        b[5] = next((o[2] for o in found[k + 1:k + 2] if o[1] == ""), None)
    return [tuple(b) for b in found]


CASES = [(doc,) + b for doc in DOCUMENTS for b in blocks(doc) if b[1] != ""]
# A block that rebuilds or reinstalls the package (README's `make python`) runs alone, after the
# parallel pass: the other tests import the extension it rewrites. The rest run beside other tests.
REBUILDS = re.compile(r"^\s*(make\b|pip install|scripts/build\.sh)", re.M)


def case_param(case):
    marks = [pytest.mark.serial] if case[2] in RUN and case[4] != "skip" and REBUILDS.search(case[3]) else []
    return pytest.param(*case, marks=marks, id="%s:%d" % (case[0], case[1]))


def shorten(text):
    return re.sub(r"--steps([ =])(\d+)", lambda m: "--steps%s%d" % (m.group(1), min(int(m.group(2)), 2)), text)


def shell(script, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RANK", "WORLD_SIZE",
                                                           "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run(["bash", "-c", "set -eo pipefail\nsource scripts/env.sh\n" + script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def check(result, what):
    if result.returncode != 0:
        pytest.fail("%s exited %d\n--- stdout\n%s\n--- stderr\n%s" % (what, result.returncode, result.stdout[-5000:],
                                                                    result.stderr[-5000:]))
    return result


@pytest.mark.parametrize("document,line,language,text,directive,reason,output", [case_param(c) for c in CASES])
def test_documented_block_runs(document, line, language, text, directive, reason, output):
    where = "%s:%d (```%s)" % (document, line, language)
    if directive == "skip":
        assert reason, "%s: a skipped block says why" % where
        pytest.skip(reason)
    assert directive in (None, "expect-errors"), "%s: unknown doc-test directive %r" % (where, directive)
    assert language in RUN, "%s: a ```%s block does not run; say why with <!-- doc-test: skip: ... -->" % (where, language)
    if language == "sh":
        check(shell(shorten(text)), where)
    elif language == "python":
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(text + "\n")
        try:
            check(shell("python %s" % f.name), where)
        finally:
            os.unlink(f.name)
    else:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(text + "\n")
        try:
            result = shell("tessera config check %s" % f.name, timeout=120)
        finally:
            os.unlink(f.name)
        if directive == "expect-errors":
            assert result.returncode == 1, "%s: expected config errors\n%s" % (where, result.stdout + result.stderr)
            shown = [l.strip() for l in (output or "").splitlines() if l.strip().startswith("error:")]
            assert shown, "%s: expect-errors needs the errors in the output block after it" % where
            for error in shown:
                assert error in result.stdout + result.stderr, "%s: %r not in\n%s" % (where, error, result.stdout)
            assert (result.stdout + result.stderr).count("error:") == len(shown), \
                "%s: the output shown lists %d errors, the check gives\n%s" % (where, len(shown), result.stdout)
        else:
            check(result, where)


def test_the_documents_have_blocks_that_run():
    assert sum(1 for c in CASES if c[4] is None or c[4] == "expect-errors") >= 5
