"""What the first frame holds and when the form arrives (a probe for issue 17's 1.25x target, not a
benchmark of its own): the app as shipped (no field in the first frame; the Essentials section one
refresh later) and as it was before (its first three fields in the first frame), each against the
Textual hello world in the same 80x24 pty, alternating, timed to three marks on the screen: the key
bar (the first frame), the first field (strategy) and the section's last field (precision).

    .venv/bin/python -m bench.first_frame_parts [--reps 7] [--json FILE]

Variants are patched in a launcher script, never in the app.
"""
from __future__ import annotations

import argparse
import json
import sys

from bench import common as C
from bench import first_frame as F

_RUN = "\nfrom torchdeck.app.main import TorchdeckApp\nTorchdeckApp().run()\n"
VARIANTS = {"as shipped": "",
            "3 fields in the first frame": "import torchdeck.app.configure.build as Fb\nFb.FIRST_FRAME_FIELDS = 3\n"}
MARKS = {"first frame": "Launch", "first field": "strategyddp", "Essentials complete": "precision32-true"}


def run(reps: int = 7) -> dict:
    tmp = C.tmpdir("first_frame_parts")
    env = F._env(tmp)
    (tmp / "hello.py").write_text(F.HELLO)
    cases = {"hello world": ([sys.executable, str(tmp / "hello.py")], "Hello,world!")}
    for i, (name, patch) in enumerate(VARIANTS.items()):
        script = tmp / f"variant{i}.py"
        script.write_text(patch + _RUN)
        for mark, text in MARKS.items():
            cases[f"{name}: {mark}"] = ([sys.executable, str(script)], text)
    for argv, marker in cases.values():  # warm the file cache and the bytecode
        F.frame_time(argv, marker, env)
    times = C.alternate(reps, *[(lambda a=a, m=m: F.frame_time(a, m, env)) for a, m in cases.values()])
    hello = C.median(times[0])
    out = {name: {"median_s": C.median(t), "ratio": C.median(t) / hello, "runs_s": t} for name, t in zip(cases, times)}
    for name, r in out.items():
        print(f"{name:48s} {r['median_s']:.3f} s  {r['ratio']:.2f}x")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json")
    a = p.parse_args()
    out = run(a.reps)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"reps": a.reps, "results": out}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
