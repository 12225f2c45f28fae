"""The layout of OUT, in one place: every reader and writer spells its paths here.

    OUT/pages/shard-NNNNN/part-<run_id>-<seq>.parquet   page rows, immutable, committed atomically
    OUT/_done/shard-NNNNN.json                          written last: the shard is complete
    OUT/_runs/<run_id>.json                             one record per run
    OUT/_producer.json                                  what produced OUT: engine, model, settings (producer.py)
    OUT/_plan/shard-NNNNN.parquet, OUT/_plan/plan.json  a frozen plan (batchocr plan)
    OUT/_compact/shard-NNNNN.json                       while `batchocr compact` works on the shard (its claim)
    OUT/_tmp/                                           local disk: part files being written (STAGING; gone when empty;
                                                        a killed writer's temp: removed by a run once an hour old)

Why `shard-NNNNN` and not hive's `shard=NNNNN`: `shard` is a column of every
row, and a `key=value` folder makes pandas, pyarrow and duckdb add a second
`shard` from the folder name (pandas then fails to merge int32 with its
dictionary type; duckdb silently turns the column into VARCHAR). Without it,
`OUT/pages` and `OUT/pages/**/*.parquet` open with no options in pandas, duckdb,
polars and pyarrow, with the file's own types. Metadata folders start with `_`;
a local write is staged in `OUT/_tmp` and renamed into place, so no reader of
`OUT/pages` ever meets a half-written file.
"""

from __future__ import annotations

import re

PAGES = "pages"
DONE = "_done"
RUNS = "_runs"
COMPACTING = "_compact"
PLAN_DIR = "_plan"
PLAN = f"{PLAN_DIR}/plan.json"
PRODUCER = "_producer.json"
STAGING = "_tmp"  # Store.write_atomic's staging folder for part files
# Every file batchocr writes under OUT ends in one of these: part files and plans are Parquet, the
# rest JSON, and a local write's temp (staged or beside its target) `.tmp`. None is a document's
# extension, so an OUT inside SOURCE is never read as documents (sources.check_stores).
SUFFIXES = (".parquet", ".json", ".tmp")

_SHARD = re.compile(r"shard-(\d{5,})")
_PART = re.compile(r"part-(.+)-\d{5,}\.parquet")
# The layout of batchocr 0.1 (hive folders): found only to say what to do with it.
_OLD_SHARD = re.compile(r"shard=(\d{5,})")


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}"


def shard_dir(shard: int) -> str:
    """A shard's folder of part files."""
    return f"{PAGES}/{shard_name(shard)}"


def part_file(shard: int, run_id: str, seq: int) -> str:
    return f"{shard_dir(shard)}/part-{run_id}-{seq:05d}.parquet"


def compacted_part(shard: int, stamp: str) -> str:
    return part_file(shard, f"compact-{stamp}", 0)


def compact_claim(shard: int) -> str:
    return f"{COMPACTING}/{shard_name(shard)}.json"


def part_run(rel: str) -> str | None:
    """The run whose rows a part file holds, from its name (part_file's); None for a compacted
    part (rows of many runs) or a name batchocr does not give."""
    m = _PART.fullmatch(rel.rpartition("/")[2])
    return None if m is None or m.group(1).startswith("compact-") else m.group(1)


def done_marker(shard: int) -> str:
    return f"{DONE}/{shard_name(shard)}.json"


def run_record(run_id: str) -> str:
    return f"{RUNS}/{run_id}.json"


def plan_shard(shard: int) -> str:
    return f"{PLAN_DIR}/{shard_name(shard)}.parquet"


def if_moved_out(rel: str) -> str:
    """What to do with one of OUT's state files that cannot be read, and what it costs (the
    page table is the part files: none of these holds a page)."""
    if rel.startswith(f"{RUNS}/"):
        return ("move it out of OUT: a past run's record, which report and status then leave out; "
                "that run's rows count as made with OUT's settings")
    if rel.startswith(f"{DONE}/"):
        return "move it out of OUT: the shard's done-marker; the next run checks the shard again, redoing no page"
    if rel == PRODUCER:
        return "move it out of OUT: the next run takes OUT's settings from its latest run record"
    if rel.startswith(f"{PLAN_DIR}/"):
        return (f"move OUT's {PLAN_DIR} folder out of it and run `batchocr plan` again: documents "
                "with rows keep their shards, so no page is redone")
    return "move it out of OUT"


def shard_of_folder(name: str) -> int | None:
    """The shard a folder under OUT/pages holds (None: not a shard folder)."""
    m = _SHARD.fullmatch(name)
    return int(m.group(1)) if m else None


def is_old_layout(folder_names: list[str]) -> bool:
    """OUT/pages written by batchocr 0.1 (pages/shard=NNNNN)."""
    return any(_OLD_SHARD.fullmatch(n) for n in folder_names)
