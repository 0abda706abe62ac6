"""A warm interpreter that the Python tests' ranks are forked from, so that a rank does not pay for
importing torch and tessera again (about 2 s of CPU each; the suite starts some 500 ranks).

The tests still launch every job through `tessera launch`: each rank the launcher starts is this
file run as a small client (`python -S rank_zygote.py run SOCKET script.py args...`, stdlib only,
~20 ms) that hands its argv, environment, working directory and stdin/stdout/stderr to the zygote
over a Unix socket. The zygote (started once per pytest process, `serve SOCKET`, with torch and
tessera imported) forks a child that takes them on and runs the script as `__main__`, as
`python script.py` would. The client stays the launcher's process for that rank:

  - it forwards the signals a launcher or a user sends (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
    SIGUSR2) to the child, and ends as the child ended (its exit status, or killed by its signal);
  - the child joins the client's process group (the launcher's killpg() reaches it as it would
    the rank's own interpreter), and if the client dies without a word anyway, the zygote sees its
    socket close and SIGKILLs the child, so nothing outlives the launcher's view of the rank.

What a forked child does not share with a fresh interpreter is what was decided at import time: the
zygote is started with OMP_NUM_THREADS=1 (what the launcher gives ranks), the child sets torch's
threads from its own OMP_NUM_THREADS, and numpy's global generator is seeded again (a child's VmHWM
starts from its own RSS, so the memory tests' deltas hold). Tests of the process itself (GPU ranks:
CUDA must not meet a forked process; the crash, interrupt and emulated-host tests, which start
their jobs themselves) run fresh interpreters (conftest.launch(..., fresh_interpreter=True)).
TESSERA_TEST_FRESH_RANKS=1 turns the zygote off.
"""
import json
import os
import signal
import socket
import struct
import sys

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def send_message(sock, obj, fds=()):
    data = json.dumps(obj).encode()
    header = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(sock, [header + data], list(fds))
    else:
        sock.sendall(header + data)


def receive_message(sock, max_fds=0):
    """One message (None when the peer closed), with the file descriptors that came with it."""
    fds = []
    buffer = b""
    while len(buffer) < 4 or len(buffer) < 4 + struct.unpack("!I", buffer[:4])[0]:
        if max_fds and not fds:
            chunk, got, _, _ = socket.recv_fds(sock, 1 << 16, max_fds)
            fds.extend(got)
        else:
            chunk = sock.recv(1 << 16)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        buffer += chunk
    return json.loads(buffer[4:].decode()), fds


# ---- the client: one per rank, started by the launcher ------------------------------------------

def run_client(socket_path, argv):
    """Runs `argv` (a script and its arguments) in a child of the zygote; exits as it did."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
        send_message(sock, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "group": os.getpgid(0)},
                     fds=(0, 1, 2))
        reply, _ = receive_message(sock)
    except OSError:
        reply = None
    if reply is None or "pid" not in reply:  # no zygote: a fresh interpreter, as without this file
        os.execv(sys.executable, [sys.executable] + argv)
    child = reply["pid"]

    def forward(sig, _frame):
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)
    end, _ = receive_message(sock)  # a forwarded signal interrupts recv, which Python retries
    if end is None:  # the zygote went away: the child with it (it SIGKILLs its children)
        sys.exit(1)
    if end["signal"]:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), end["signal"])
    os._exit(end["status"])


# ---- the zygote: one per pytest process -----------------------------------------------------------

def serve(socket_path):
    import selectors
    # What the ranks import first; their own modules (the workers) each child imports itself.
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import tessera  # noqa: F401
    import torch.distributed  # noqa: F401
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children = {}  # pid -> the client's socket
    parent = os.getppid()
    print("ready", flush=True)
    while os.getppid() == parent:  # pytest gone: so is the zygote
        for key, _ in selector.select(timeout=0.02):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                request, fds = receive_message(conn, max_fds=3)
                if request is None:
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for other in children.values():
                        other.close()
                    conn.close()
                    become_rank(request, fds)  # never returns
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
                send_message(conn, {"pid": pid})
            else:  # a client closed its socket before its child ended: it was killed
                pid = key.data
                try:
                    if key.fileobj.recv(1) == b"":
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
                selector.unregister(key.fileobj)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is None:
                continue
            try:
                selector.unregister(conn)
            except (KeyError, ValueError):
                pass
            try:
                send_message(conn, {"status": os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1,
                                    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0})
            except OSError:
                pass
            conn.close()
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def become_rank(request, fds):
    """In the forked child: take on the client's stdio, environment, directory and argv, and run the
    script as __main__; end as `python script.py` would."""
    import runpy
    import traceback
    try:  # the client's process group (the launcher's killpg reaches the child), where the session allows
        os.setpgid(0, request["group"])
    except OSError:
        pass
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script)] + pythonpath + [p for p in sys.path[1:] if p not in pythonpath]
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy
    import torch
    numpy.random.seed()
    # The zygote's threads were fixed at its import (OMP_NUM_THREADS=1): the child takes its own
    # (a process started without the launcher: torch's default, every core it may run on).
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() else len(os.sched_getaffinity(0)))
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        status = 1
    import atexit
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


if __name__ == "__main__":
    args = sys.argv[1:]
    # `tessera launch --pass-local-rank` puts --local_rank=N after the first script it sees, this
    # file: it goes where the launcher would have put it, after the rank's own script.
    passed = [a for a in args[:1] if a.startswith("--local_rank=")]
    args = args[len(passed):]
    if args[0] == "run":
        run_client(args[1], args[2:3] + passed + args[3:])
    elif args[0] == "serve":
        serve(args[1])
