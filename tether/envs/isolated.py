"""``env.isolation: process``: each env in a child process of its own, so that every fault of it is bounded.

:class:`~tether.envs.safe.SafeEnv` runs an env's calls in threads: a call that sleeps, raises or waits on I/O is
contained, but Python cannot kill a thread, so a step that busy-loops keeps burning a core after its timeout (and the
next one beside it, until the run crawls), and an env that ends its process (``os._exit``, a crash in native code)
ends the trainer with it. :class:`ProcessEnv` is a SafeEnv whose env lives in a child process, driven over a pipe:

* every call (construction, ``reset``, ``step``, ``parse_action``, ``solution``, ``close``) waits at most its limit
  (``env.timeout_s``; ``env.reset_timeout_s`` for construction and reset); past it the child is killed, whatever
  it was doing, and the call is a fault like any other (counted in ``env/faults``, a reset retried);
* a child that dies is a fault with one line naming the env, the call and how the process ended
  (``scripted step('up'): the env's process ended with exit code 7``);
* an exception in the env is a fault as in-process, and the child serves the next env.

A child serves one env at a time and is reused by later episodes (:class:`ChildPool`), so a run starts as many
children as it has envs alive at once (the episodes of a step, or of validation); after that a call costs the
pipe's round trip. Children are forked by a :class:`Zygote`: a small process of their own, started once per pool,
that has imported the env's module. Forking it is cheap and safe where forking the trainer is neither: fork's
cost grows with the forking process's memory (the trainer holds a model), and a fork copies no thread, so a lock
another of the trainer's threads held would stay locked in the child. The env's class and ``env.kwargs`` reach the
zygote pickled (the class by reference: it must be importable with the trainer's ``sys.path``, which the zygote
gets), so a class defined inside a function needs ``env.isolation: thread``. POSIX only (fork, descriptor passing).

The env processes ignore Ctrl-C and SIGTERM (the trainer's to handle: it may finish its step, with its envs, before it
stops) and end with the trainer: when it closes their pipes, or, if it is killed, when the zygote sees its own pipe
close and ends, and the kernel kills the zygote's children with it (Linux), even one busy in a step.

The same machinery runs a reward function with a limit (:mod:`tether.rewards.process`): a pool's :class:`Subject`
says what its processes serve, for its messages and for what ``make`` answers.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

from tether.envs.base import EpisodeOverError, TextEnv
from tether.envs.safe import EnvFault, SafeEnv

START_LIMIT_S = 120.0  # for the zygote to start and import the env's module, and for a fork (not the env's limits)


@dataclass(frozen=True)
class EnvFacts:
    """What the trainer reads of a freshly built env (a :class:`ProcessEnv`'s ``_env`` stands for the env)."""

    name: str
    max_turns: int
    action_format: str
    renders_images: bool


def env_facts(env: TextEnv) -> EnvFacts:
    """What a child's ``make`` answers for an env."""
    return EnvFacts(env.name, env.max_turns, env.action_format, bool(getattr(env, "renders_images", False)))


@dataclass(frozen=True)
class Subject:
    """What a pool's processes serve (an env; a reward function, :mod:`tether.rewards.process`), for the messages of
    its faults and for what a child's ``make`` answers.

    Attributes:
        noun: the thing served, in messages: "the env's process ended with exit code 7".
        code: what must pickle to reach a process.
        opt_out: how to run it without a process, for a class that cannot reach one.
        describe: ``make``'s reply, from the object built (a module-level function: it is pickled by reference).
    """

    noun: str
    code: str
    opt_out: str
    describe: Callable[[Any], Any]


ENV = Subject("env", "the env's class and env.kwargs", "set env.isolation: thread", env_facts)


def serve(conn: Connection, factory: Callable[[], Any], describe: Callable[[Any], Any]) -> None:
    """A child's loop, until the pipe closes: ``make`` builds an object with ``factory`` (kept for the calls that
    follow) and answers ``describe(it)``, ``call`` calls one of its methods.

    Replies are ``("ok", value)``, ``("raised", ("Type: message", "Type", traceback))`` or ``("over", message)`` for
    :class:`EpisodeOverError` (a caller bug, re-raised in the trainer as in-process).
    """
    env: Any = None
    while True:
        try:
            op, payload = conn.recv()
        except (EOFError, OSError):  # the trainer is done with this child, or gone
            return
        try:
            if op == "make":
                env = factory()
                value: Any = describe(env)
            else:
                method, args = payload
                value = getattr(env, method)(*args)
            reply: tuple[str, Any] = ("ok", value)
        except EpisodeOverError as e:
            reply = ("over", str(e))
        except BaseException as e:  # anything the env throws is contained, SystemExit too
            reply = ("raised", (f"{type(e).__name__}: {e}", type(e).__name__, traceback.format_exc()))
        try:
            conn.send(reply)
        except OSError:  # the trainer is gone
            return
        except Exception as e:  # the result did not pickle
            conn.send(("raised", (f"its result could not be sent to the trainer ({type(e).__name__}: {e})",
                                  "bad result", None)))


def ignore_stop_signals() -> None:
    """Ctrl-C and SIGTERM are the trainer's, which may finish its step (its envs' processes still serving it) before it
    stops; the env processes end when the trainer closes their pipes or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent (the zygote) ends, so that a child busy in a step when the
    trainer is killed (and the zygote, seeing its pipe close, ends) does not spin on as an orphan. Linux only."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def zygote_main(fd: int) -> None:
    """The zygote's loop: read the factory and its ``describe`` (after the trainer's ``sys.path``), then fork one
    :func:`serve` child per ``fork`` request (its pid, then its end of the pipe, go back) and reap the child a
    ``wait`` request names."""
    ignore_stop_signals()
    zygote = os.getpid()
    conn = Connection(fd)
    paths, blob = conn.recv()
    sys.path[:] = [*paths, *(p for p in sys.path if p not in paths)]
    try:
        factory, describe = pickle.loads(blob)
    except BaseException as e:  # the env's module does not import here
        conn.send(("raised", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", "ready"))
    with contextlib.suppress(EOFError, OSError):  # the trainer closed the pipe, or is gone
        while True:
            serve_request(conn, zygote, factory, describe)


def serve_request(conn: Connection, zygote: int, factory: Callable[[], Any],
                  describe: Callable[[Any], Any]) -> None:
    """One request to the zygote: ``("fork", _)`` or ``("wait", pid)``."""
    op, pid = conn.recv()
    if op == "wait":
        try:
            conn.send(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        except ChildProcessError:  # not a child of this zygote (any more)
            conn.send(None)
        return
    theirs, mine = socket.socketpair()
    child = os.fork()
    if child == 0:
        die_with_parent()
        if os.getppid() != zygote:  # the zygote ended before the line above took effect
            os._exit(0)
        conn.close()
        theirs.close()
        try:
            serve(Connection(mine.detach()), factory, describe)
        finally:
            os._exit(0)  # never back into the zygote's loop
    mine.close()
    conn.send(child)
    send_handle(conn, theirs.fileno(), os.getppid())
    theirs.close()


def exit_description(code: int | None) -> str:
    """How a process ended, in words: ``exit code 7``, ``signal SIGSEGV``."""
    if code is None:
        return "no exit code known"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Unreachable(Exception):
    """The env's class cannot reach a child process (it does not pickle, or its module does not import there)."""


class Zygote:
    """The process that forks the children of one :class:`ChildPool` (why: the module docstring)."""

    def __init__(self, factory: Callable[[], Any], subject: Subject) -> None:
        self.subject = subject
        try:
            blob = pickle.dumps((factory, subject.describe))
        except Exception as err:  # a class defined inside a function, a kwarg that does not pickle
            raise Unreachable(f"{subject.code} must pickle to reach its process ({type(err).__name__}: {err}); "
                              f"define the class at the top of a module, or {subject.opt_out}") from None
        mine, theirs = socket.socketpair()
        code = "import sys; from tether.envs.isolated import zygote_main; zygote_main(int(sys.argv[1]))"
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        self.process = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], env=environ,
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send((list(sys.path), blob))
        self.ready = False
        self.lock = threading.Lock()  # one request at a time, whichever thread asks

    def fork(self, what: str) -> tuple[int, Connection]:
        """A new child: its pid and the trainer's end of its pipe (raises :class:`EnvFault` if none can be made)."""
        with self.lock:
            return self._fork(what)

    def _fork(self, what: str) -> tuple[int, Connection]:
        try:
            if not self.ready:
                status, value = self._answer(what)
                if status != "ok":
                    raise Unreachable(f"the {self.subject.noun}'s class does not import in a child process "
                                      f"({value}); make its module importable, or {self.subject.opt_out}")
                self.ready = True
            self.conn.send(("fork", 0))
            pid = self._answer(what)
            return pid, Connection(recv_handle(self.conn))
        except (EOFError, OSError):
            code = self.process.poll()
            raise EnvFault(f"{what}: the process that starts {self.subject.noun} processes ended with "
                           f"{exit_description(code)}", timed_out=True) from None

    def wait(self, pid: int) -> int | None:
        """Reap child ``pid`` (which has ended or been killed) and return its exit code (negative: a signal)."""
        with self.lock, contextlib.suppress(EOFError, OSError):
            self.conn.send(("wait", pid))
            if self.conn.poll(5.0):
                return self.conn.recv()
        return None

    def _answer(self, what: str) -> Any:
        if not self.conn.poll(START_LIMIT_S):
            raise EnvFault(f"{what}: no {self.subject.noun} process started within {START_LIMIT_S:g}s",
                           timed_out=True)
        return self.conn.recv()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def end(self) -> None:
        self.conn.close()  # its loop returns; its idle children see their pipes close when the pool's do
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5.0)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Child:
    """One env process (forked by ``zygote``) and the trainer's end of its pipe."""

    def __init__(self, zygote: Zygote, what: str) -> None:
        self.zygote = zygote
        self.pid, self.conn = zygote.fork(what)
        self.ended = False
        self.made = False  # whether "make" built its object: a caller that makes once per child (a reward term)

    def request(self, op: str, payload: Any, *, timeout_s: float, what: str) -> Any:
        """Send one request and wait at most ``timeout_s`` for its reply.

        Raises:
            EnvFault: the env raised (``timed_out=False``), the call outlived ``timeout_s`` (the child is killed)
                or the child died (both ``timed_out=True``: the env is gone, nothing is left to close).
        """
        try:
            self.conn.send((op, payload))
            if not self.conn.poll(timeout_s):
                self.end()
                raise EnvFault(f"{what} timed out after {timeout_s:g}s (its process was killed)", timed_out=True)
            status, value = self.conn.recv()
        except (EOFError, OSError):
            raise EnvFault(f"{what}: the {self.zygote.subject.noun}'s process ended with "
                           f"{exit_description(self.end())}",
                           timed_out=True, kind="process ended") from None
        if status == "ok":
            return value
        if status == "over":
            raise EpisodeOverError(value)
        error, kind, trace = value
        raise EnvFault(f"{what} raised {error}", timed_out=False, kind=kind, traceback=trace)

    def end(self) -> int | None:
        """Kill the child (if it still runs) and reap it; its exit code, or None if it was ended before."""
        if self.ended:
            return None
        self.ended = True
        self.conn.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return self.zygote.wait(self.pid)


class ChildPool:
    """Processes that build their object (an env, by default) with ``factory``: idle ones are reused by later
    episodes (or calls); one that was killed or died is replaced by a fresh one."""

    def __init__(self, factory: Callable[[], Any], subject: Subject = ENV) -> None:
        self.factory, self.subject = factory, subject
        self.zygote: Zygote | None = None
        self.idle: list[Child] = []
        self.started = 0  # children started so far
        self.broken: str | None = None  # why no child can be made (the env's class does not reach a process)
        self.lock = threading.Lock()  # the pool's envs are called from several threads at once
        weakref.finalize(self, end_all, self.idle)

    def take(self, what: str) -> Child:
        """An idle child, else a new one (raises :class:`EnvFault` if none can be made)."""
        with self.lock:
            return self._take(what)

    def _take(self, what: str) -> Child:
        if self.idle:
            return self.idle.pop()
        if self.broken is not None:
            raise EnvFault(f"{what}: {self.broken}", timed_out=True)
        try:
            if self.zygote is None or not self.zygote.alive:
                self.zygote = Zygote(self.factory, self.subject)
                weakref.finalize(self, self.zygote.end)
            child = Child(self.zygote, what)
        except Unreachable as err:
            self.broken = str(err)
            raise EnvFault(f"{what}: {self.broken}", timed_out=True) from None
        self.started += 1
        return child

    def give(self, child: Child) -> None:
        with self.lock:
            if not child.ended:
                self.idle.append(child)


def end_all(children: list[Child]) -> None:
    """End the idle children (a pool let go of, or the trainer exiting)."""
    for child in children:
        child.end()
    children.clear()


class ProcessEnv(SafeEnv):
    """A :class:`SafeEnv` whose env lives in a child process taken from ``children``.

    Same contract as SafeEnv (faults end the episode, counted; a faulted construction or reset is retried with a
    fresh env); what differs is that a call past its limit kills the child, and a child that dies is a fault.
    """

    def __init__(self, children: ChildPool, timeout_s: float = 30.0, reset_timeout_s: float | None = None,
                 reset_retries: int = 0) -> None:
        self._children = children
        self._child: Child | None = None
        super().__init__(children.factory, timeout_s=timeout_s, reset_timeout_s=reset_timeout_s,
                         reset_retries=reset_retries)

    def _start(self) -> None:
        """Nothing yet: the first ``reset`` builds the env (as a retry after a constructor fault would), so that the
        pool's ``reset_all`` builds the envs of a batch at once."""

    def _build(self) -> None:
        self._adopt(self._request("make", None, self.reset_timeout_s, f"{self.name} make()"))

    def _call(self, method: str, *args: Any, timeout_s: float, what: str) -> Any:
        return self._request("call", (method, args), timeout_s, what)

    def _request(self, op: str, payload: Any, timeout_s: float, what: str) -> Any:
        try:
            if self._child is None:
                self._child = self._children.take(what)
            return self._child.request(op, payload, timeout_s=timeout_s, what=what)
        except EnvFault as fault:
            if fault.timed_out:  # killed or dead: the next env gets a fresh child
                self._child = None
            raise

    def close(self) -> None:
        """Close the env and hand the child back for the next episode."""
        super().close()
        if self._child is not None:
            self._children.give(self._child)
            self._child = None
