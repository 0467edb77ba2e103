"""``alphamodel``: model training on alphafeat caches (coming; see the project issues).

Planned: ``alphamodel train --cache DIR`` — a Mamba2 state-space encoder, a CfC recurrent
cell and multi-horizon direction heads, trained with purged walk-forward splits.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Say what is coming and exit 2 (nothing is implemented yet)."""
    print(
        "alphamodel: not implemented yet. Planned: `alphamodel train --cache DIR` "
        "(Mamba2 -> CfC -> multi-horizon heads) on caches written by `alphafeat precompute`.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
