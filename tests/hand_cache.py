"""A hand-made alphafeat cache for alphamodel tests: one Arrow partition per session plus the
manifest, written the way ``alphafeat precompute`` lays them out (no DBN, no pipeline)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from alphafeat.cache import FORMAT_VERSION, MANIFEST


def write_hand_cache(root: Path, sessions: list[dict[str, pa.Array]], columns: list[dict],
                     horizons: list[int]) -> Path:
    """Write ``sessions[s]`` (column name -> array) as ``root=ES/session=2024-03-0{s+4}/ESH4.arrow``
    and a manifest naming ``columns`` and ``horizons`` (tick size 0.25). Returns ``root``."""
    parts = []
    for s, cols in enumerate(sessions):
        rel = f"root=ES/session=2024-03-0{s + 4}/ESH4.arrow"
        (root / rel).parent.mkdir(parents=True)
        table = pa.table(cols)
        with pa.OSFile(str(root / rel), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        parts.append(rel)
    manifest = {"format_version": FORMAT_VERSION, "params": {"horizons": horizons, "features": {"tick_size": 0.25}},
                "columns": columns, "partitions": parts}
    (root / MANIFEST).write_text(json.dumps(manifest))
    return root
