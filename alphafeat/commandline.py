"""What the command lines ``alphafeat`` (:mod:`alphafeat.cli`) and ``alphamodel``
(:mod:`alphamodel.cli`) share.

Both parse with :class:`Parser` (a usage error is one line and exit status 2), take option
values through :func:`option` (the ``validate_*`` functions of :mod:`alphafeat.validation`
as argparse ``type=``) and run the command with :func:`run` (an
:class:`~alphafeat.errors.AlphafeatError` is one line and its ``exit_code``; ``-v`` adds the
traceback).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TextIO

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from alphafeat.errors import AlphafeatError, UsageError
from alphafeat.options import argparse_type

#: Progress bars, logs and errors go to stderr; tables to stdout.
console = Console(stderr=True)


def stdout_console() -> Console:
    """The console for a command's results on stdout: the terminal's width on a terminal; off
    one (a file, a pipe) lines left unwrapped and tables up to 200 columns, where rich would
    squeeze them into 80."""
    con = Console()
    return con if con.is_terminal else Console(width=200, soft_wrap=True)


#: Seconds a command runs before its progress bar shows (rich's progress and table modules are
#: imported then, on a thread: not on the way to a short job's first record).
BAR_DELAY = 0.5


@dataclasses.dataclass
class _Task:
    """A task of :class:`LaterBar`: what rich's bar shows of it, and its id there once shown."""

    description: str
    total: float | None
    started: float  # time.monotonic()
    completed: float = 0
    finished: float | None = None
    rich: int | None = None


class LaterBar:
    """A progress bar on stderr that starts :data:`BAR_DELAY` seconds after it is made:
    :meth:`add_task` and :meth:`advance` as rich's ``Progress`` takes them, recorded until then.
    A job that ends sooner shows its bar at the end, as it would have been."""

    def __init__(self, disable: bool = False) -> None:
        self.disable = disable
        self.bar = None
        self._tasks: list[_Task] = []
        self._lock = threading.Lock()
        self._ended = False
        self._timer = threading.Timer(BAR_DELAY, self._show)
        self._timer.daemon = True
        if not disable:
            self._timer.start()

    def _show(self, final: bool = False) -> None:
        """Start rich's bar with the tasks so far, their clocks as they were (``final``: the job
        ended before the delay: shown once and stopped)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console, transient=False, get_time=time.monotonic)  # fmt: skip
        with self._lock:
            if self.bar is not None or self._ended:
                return
            for t in self._tasks:
                t.rich = bar.add_task(t.description, total=t.total, completed=t.completed, start=False)
                task = bar.tasks[-1]
                task.start_time = t.started
                if t.finished is not None:
                    task.finished_time = t.finished - t.started
            bar.start()
            self.bar = bar
            if final:
                self._ended = True
                bar.stop()

    def add_task(self, description: str, total: float | None = None) -> int:
        """A new task (rows of the bar); returns its id."""
        with self._lock:
            t = _Task(description, total, started=time.monotonic())
            self._tasks.append(t)
            if self.bar is not None and not self._ended:
                t.rich = self.bar.add_task(description, total=total)
            return len(self._tasks) - 1

    def advance(self, task: int, advance: float = 1) -> None:
        """Task ``task`` is ``advance`` further."""
        with self._lock:
            t = self._tasks[task]
            t.completed += advance
            if t.finished is None and t.total is not None and t.completed >= t.total:
                t.finished = time.monotonic()
            if self.bar is not None and not self._ended:
                self.bar.advance(t.rich, advance)

    def stop(self, failed: bool = False) -> None:
        """End the bar: left on screen (shown now if it had not started), or cleared when
        ``failed`` (a failed run's stderr is its one error line)."""
        self._timer.cancel()
        if self.disable:
            return
        if self.bar is None and not failed:
            self._show(final=True)
        with self._lock:
            bar, ended, self._ended = self.bar, self._ended, True
        if bar is None or ended:
            return
        if failed:
            bar.live.transient = True
            bar.live.stop()  # not bar.stop(): it adds a blank line on a non-terminal stderr
        else:
            bar.stop()


@contextlib.contextmanager
def progress_bar(disable: bool = False) -> Iterator[LaterBar]:
    """A progress bar on stderr (:class:`LaterBar`) that stays on screen when the job ends and
    is cleared when it fails, so that a failed run's stderr is its one error line."""
    bar = LaterBar(disable=disable)
    try:
        yield bar
    except BaseException:
        bar.stop(failed=True)
        raise
    bar.stop()


def usage_line(prog: str, message: str) -> str:
    """A usage error as one line: ``PROG: error: MESSAGE (see PROG --help)``."""
    return f"{prog}: error: {' '.join(message.split())} (see {prog} --help)"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (:func:`usage_line`), exit status 2.

    ``options``: a function adding options to the parser, called when the parser is first used
    (parsing, ``--help``, :meth:`complete`), not when it is built: a command's options declared
    by a config whose module imports numba (``precompute``'s) cost the program's other commands
    and its ``--help`` nothing.
    """

    def __init__(self, *args: Any, options: Callable[[argparse.ArgumentParser], object] | None = None,
                 **kw: Any) -> None:  # fmt: skip
        super().__init__(*args, **kw)
        self.deferred = options

    def complete(self) -> Parser:
        """The parser with its deferred options added (once)."""
        add, self.deferred = self.deferred, None
        if add is not None:
            add(self)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        return super(Parser, self.complete()).parse_known_args(args, namespace)

    def format_usage(self) -> str:
        return super(Parser, self.complete()).format_usage()

    def format_help(self) -> str:
        return super(Parser, self.complete()).format_help()

    def error(self, message: str) -> NoReturn:
        self.exit(2, usage_line(self.prog, message) + "\n")


def add_command(sub: argparse._SubParsersAction, name: str, text: str, **kw: Any) -> argparse.ArgumentParser:
    """The command ``name`` of ``sub``, ``text`` both its line in the program's ``--help`` and
    the first line of its own (``%%`` is ``%`` in both: argparse %-formats the one, not the other)."""
    return sub.add_parser(name, help=text, description=text.replace("%%", "%"), **kw)


def option(validate: Callable[..., Any], **kw: Any) -> Callable[[str], Any]:
    """``validate(text, option, **kw)`` as an argparse ``type=``: its UsageError becomes
    argparse's one-line error (``argument --horizons: expected ..., got '0'``), exit 2
    (:func:`alphafeat.options.argparse_type`)."""
    return argparse_type(validate, **kw)


def verbose_parent(help: str) -> argparse.ArgumentParser:
    """A parent parser giving a subcommand ``-v`` too (``alphafeat precompute ... -v``), without
    overriding the main parser's ``-v`` when it is not given there."""
    p = Parser(add_help=False)
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=help)
    return p


def run(parser: argparse.ArgumentParser | Callable[[], argparse.ArgumentParser], argv: list[str] | None,
        verbose_level: int = logging.DEBUG, own_process: bool = False) -> int:  # fmt: skip
    """Parse ``argv`` with ``parser`` (or the parser a function of no argument builds: a Ctrl-C
    while it is built or parses, importing the modules whose options it declares, is
    :data:`INTERRUPTED` and 130 too), set up logging and call ``args.func(args)`` (the garbage collector set as
    :func:`_collector_for_a_command` says; ``own_process``: this process ends with the command,
    :func:`end_process`).

    Returns the exit status: the command's own; 2 for a usage error (argparse's, or a
    :class:`~alphafeat.errors.UsageError`); 1 for any other
    :class:`~alphafeat.errors.AlphafeatError` or an ``OSError`` from the file system (with the
    path it names); 130 on Ctrl-C. Errors are one line on stderr, with the traceback before it
    under ``-v``.
    """
    try:
        if not isinstance(parser, argparse.ArgumentParser):
            parser = parser()
        args, extra = parser.parse_known_args(argv)  # a command's deferred options are added here
        if extra:  # named by the command they were given to, as its other usage errors are
            prog = getattr(args, "prog", parser.prog)
            parser.exit(2, usage_line(prog, f"unrecognized arguments: {' '.join(extra)}") + "\n")
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        console.print(INTERRUPTED)
        return 130
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(level=verbose_level if verbose else logging.WARNING, handlers=[_log_handler()])
    args.own_process = own_process  # a command may ignore Ctrl-C once its outputs are committed
    try:
        with _collector_for_a_command():
            status = args.func(args)
    except (AlphafeatError, OSError) as e:
        if verbose:
            console.print_exception()
        prog = getattr(args, "prog", parser.prog)  # every error line starts "PROG: error:", as argparse's
        if isinstance(e, UsageError) and e.option.startswith("-"):  # worded as argparse words its own
            console.print(f"{prog}: error: argument {escape(e.option)}: {escape(e.problem)} (see {prog} --help)",
                          highlight=False, soft_wrap=True)  # fmt: skip
        else:
            console.print(f"{prog}: [bold red]error:[/] {escape(_line(e))}", highlight=False, soft_wrap=True)
        status = e.exit_code if isinstance(e, AlphafeatError) else 1
    except KeyboardInterrupt:
        console.print(INTERRUPTED)
        status = 130
    if own_process:  # the command is over: a Ctrl-C now would only break the interpreter's exit
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a traceback from a pool's exit, or 130 for a finished run)
    return status


def end_process(status: int) -> NoReturn:
    """End the process that ran a command (``alphafeat``'s own), now, with ``status``: its
    outputs are committed and printed. Python's own exit would wait for the pool's worker
    processes to be torn down, one after another (loky joins each: seconds for 16 that held a
    session's buffers or a CUDA context), then walk and tear down the ~170 k objects of the
    libraries a command imports. Here the workers get SIGKILL, all at once
    (:func:`alphafeat._command.stop_pool_workers`; precompute's map did so already), and the
    system reaps them after this process is gone. What an exit must still do is done: streams
    flushed, the pool's semaphores unlinked (else its resource tracker reports them leaked), the
    ``atexit`` handlers run (joblib's temporary folders, logging's flush) but multiprocessing's,
    which would join the workers."""
    import multiprocessing.util

    from alphafeat._command import stop_pool_workers

    stop_pool_workers()  # a command's own pool (synth's; precompute stopped its map's already)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    multiprocessing.util._run_finalizers(0)
    atexit.unregister(multiprocessing.util._exit_function)
    atexit._run_exitfuncs()
    os._exit(status)


def _log_handler() -> logging.Handler:
    """Rich's log lines on a terminal; elsewhere (a file, a pipe) plain lines, one a record,
    that rich would wrap at 80 columns, cutting the paths they name."""
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
        return handler
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    return handler


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler writing to the ``sys.stderr`` of the moment (as rich's console does),
    not the one it was made with (a test's captured stream may be closed by then)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


#: What a Ctrl-C during a command prints.
INTERRUPTED = "interrupted; outputs are written atomically, so nothing half-written was left"


#: Allocations between two young-generation collections while a command runs (CPython: 700).
GC_THRESHOLD = 10_000


@contextlib.contextmanager
def _collector_for_a_command() -> Iterator[None]:
    """The cyclic garbage collector's threshold for one command, restored after.

    A command imports its libraries (``precompute``: numba, pyarrow, databento; ~170 k objects
    that live to the end). At the default threshold (700 allocations) the collector runs ~440
    times while they are made; at :data:`GC_THRESHOLD`, ~50.
    """
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], GC_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _line(e: BaseException) -> str:
    """The one line of an error: an OSError as ``path: reason``, others as ``str(e)``."""
    if isinstance(e, OSError) and not isinstance(e, AlphafeatError):
        where = f"{e.filename}: " if e.filename else ""
        return where + str(e.strerror or e)
    return " ".join(str(e).split())
