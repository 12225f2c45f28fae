"""A run's progress as a pod's log gets it (stderr a file) and as a terminal shows it (tmux):
`batchocr run` with the default engine (rapidocr on CPU, born-digital pages from their text
layer) over 15 local documents: Debian documentation PDFs (tests/tools.py debian_doc,
cached under .tools/) and the scans and images of samples/. Writes the log to --log and
the terminal's pane, captured every --every seconds, to --terminal; the log also gets a
run stopped by SIGINT after --interrupt-after seconds and run again (a resumed run).

    python bench/progress_log.py [--log docs/progress-pod-log.txt] [--terminal docs/progress-terminal.txt]
                                 [--every 10] [--no-tmux] [--interrupt-after 45]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

DEBIAN = [("pari-doc", "usr/share/pari/doc/refcard-ell.pdf"), ("r-cran-zoo", "usr/lib/R/site-library/zoo/doc/zoo-design.pdf"),
          ("asymptote-doc", "usr/share/doc/asymptote/TeXShopAndAsymptote.pdf"), ("octave-doc", "usr/share/doc/octave/refcard-a4.pdf"),
          ("pari-doc", "usr/share/pari/doc/refcard.pdf"), ("r-cran-lmtest", "usr/lib/R/site-library/lmtest/doc/lmtest-intro.pdf"),
          ("glpk-doc", "usr/share/doc/glpk-doc/cnfsat.pdf"), ("asymptote-doc", "usr/share/doc/asymptote/CAD.pdf"),
          ("r-cran-zoo", "usr/lib/R/site-library/zoo/doc/zoo-quickref.pdf"), ("pari-doc", "usr/share/pari/doc/INSTALL.pdf")]
SAMPLES = ["scanned.pdf", "report.pdf", "fax.tiff", "letter.jpg", "receipt.png"]


def documents(src: Path) -> int:
    """The 15 documents in `src`; returns their pages."""
    import pymupdf
    from tools import debian_doc

    src.mkdir(parents=True)
    for package, path in DEBIAN:
        shutil.copy(debian_doc(package, path), src / Path(path).name)
    for name in SAMPLES:
        shutil.copy(ROOT / "samples" / name, src / name)
    return sum(pymupdf.open(p).page_count for p in src.iterdir())


def batchocr() -> list[str]:
    return [str(Path(sys.executable).with_name("batchocr"))]


def in_tmux(command: list[str], terminal: Path, every: float) -> None:
    """The run in a 120x30 tmux pane, captured every `every` s until it ends."""
    shell = shlex.join(command) + "; echo '[exit '$?']'; sleep 30"
    subprocess.run(["tmux", "new", "-d", "-s", "progress", "-x", "120", "-y", "30", shell], check=True)
    start, shots = time.monotonic(), []
    try:
        while True:
            time.sleep(every)
            pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", "progress"], capture_output=True, text=True).stdout
            shown = [line for line in pane.splitlines() if line.strip()]
            shots.append(f"--- after {time.monotonic() - start:.0f} s ---\n" + "\n".join(shown))
            if any(line.startswith("[exit ") for line in shown):
                break
    finally:
        subprocess.run(["tmux", "kill-session", "-t", "progress"], capture_output=True)
    with terminal.open("a") as f:
        f.write("\n".join(shots) + "\n")


def resumed(src: Path, out: str, log, after: float) -> None:
    """A run stopped by SIGINT (Ctrl-C, a pod's SIGTERM alike) after `after` s, then run again:
    the second run's total is the pages it still has to do."""
    import signal

    log.write(f"# the same run into a fresh OUT, SIGINT after {after:g} s:\n")
    log.flush()
    proc = subprocess.Popen(batchocr() + ["run", str(src), out], stderr=log, stdout=subprocess.PIPE, text=True)
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    log.write(f"# stdout: {proc.communicate()[0].strip()}\n# run again (the pages still to do):\n")
    log.flush()
    again = subprocess.run(batchocr() + ["run", str(src), out], stderr=log, stdout=subprocess.PIPE, text=True)
    log.write(f"# stdout: {again.stdout.strip()}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, default=ROOT / "docs/progress-pod-log.txt")
    ap.add_argument("--terminal", type=Path, default=ROOT / "docs/progress-terminal.txt")
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--no-tmux", action="store_true")
    ap.add_argument("--interrupt-after", type=float, default=45.0, help="the resumed run's first part (0: none)")
    args = ap.parse_args()
    head = (f"# {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, python bench/progress_log.py: "
            f"`batchocr run SRC OUT` over {{pages}} pages of 15 local documents ({len(DEBIAN)} Debian "
            f"documentation PDFs; samples/{', '.join(SAMPLES)}), default engine (rapidocr, CPU), "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        pages = documents(src)
        with args.log.open("w") as log:
            log.write(head.format(pages=pages) + ", stderr to this file:\n")
            log.flush()
            t = time.monotonic()
            proc = subprocess.run(batchocr() + ["run", str(src), f"{tmp}/out"], stderr=log, stdout=subprocess.PIPE,
                                  text=True)
            log.write(f"# stdout: {proc.stdout.strip()} ({time.monotonic() - t:.0f} s)\n")
            if args.interrupt_after:
                resumed(src, f"{tmp}/out-resumed", log, args.interrupt_after)
        print(args.log, proc.stdout.strip())
        if not args.no_tmux:
            args.terminal.write_text(head.format(pages=pages) + f", in tmux 120x30, the pane every {args.every:g} s:\n")
            in_tmux(batchocr() + ["run", str(src), f"{tmp}/out-tmux"], args.terminal, args.every)
            print(args.terminal)


if __name__ == "__main__":
    main()
