"""Command-line entry points: ``alphafeat`` and ``alphamodel``."""

from __future__ import annotations

import argparse
import logging

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from alphafeat.errors import AlphafeatError

#: Progress bars, logs and errors go to stderr; tables to stdout.
console = Console(stderr=True)


def run(parser: argparse.ArgumentParser, argv: list[str] | None, verbose_level: int = logging.DEBUG) -> int:
    """Parse ``argv``, set up logging and call ``args.func(args)``.

    Returns the exit status: the command's own, 1 for a user error (an
    :class:`~alphafeat.errors.AlphafeatError`, printed as one line, no traceback; likewise an
    ``OSError`` from the file system, with the path it names), 130 on Ctrl-C.
    """
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=verbose_level if args.verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        return args.func(args)
    except AlphafeatError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 1
    except OSError as e:  # the file system refused (permissions, disk full, ...): one line too
        where = f"{e.filename}: " if e.filename else ""
        console.print(f"[bold red]error:[/] {escape(where + str(e.strerror or e))}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        console.print("interrupted; outputs are written atomically, so nothing half-written was left")
        return 130
