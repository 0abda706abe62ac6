"""How a worker ends: main() runs, its objects are collected (engines close their files and join
their threads), the output is flushed, and the process exits without the interpreter's teardown.
That teardown (modules, torch's libraries' static destructors) costs about 0.5 s of CPU per rank,
which the suite pays for every rank of every launch. An exception takes the ordinary way out."""
import gc
import os
import sys


def run(main):
    status = main()
    gc.collect()  # an engine held in a reference cycle is closed here, not by the teardown skipped below
    sys.stdout.flush()
    sys.stderr.flush()
    if isinstance(status, str):  # sys.exit's meaning: print it, exit 1
        print(status, file=sys.stderr, flush=True)
        status = 1
    os._exit(status or 0)
