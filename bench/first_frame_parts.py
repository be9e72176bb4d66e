"""Where the first frame's time goes (a probe for issue 17's 1.25x target, not a benchmark of its
own): the app as shipped and with parts of its first frame taken away, each against the Textual
hello world in the same 80x24 pty, alternating, so the next person knows what a change can win.

    .venv/bin/python -m bench.first_frame_parts [--reps 7] [--json FILE]

Variants (patched in a launcher script, never in the app): `plain` (as shipped), `one-line keys`
(the key bar as one Static of the same text instead of Textual's Footer with a widget per key),
`no fields` (the form's first fields come one refresh after the first frame), and both.
"""
from __future__ import annotations

import argparse
import json
import sys

from bench import common as C
from bench import first_frame as F

_KEYS = '''
from textual.widgets import Static
import app.configure.screen as S
class OneLineKeys(Static):
    def __init__(self, *a, **k):
        super().__init__("^q Quit  F5 Launch  ^s Save  ^o Load  F6 Export  F7 Compare  F2 Runs  ^p palette")
S.KeyBar = OneLineKeys
'''
_NO_FIELDS = '''
import app.configure.form as Fm
Fm.FIRST_FRAME_FIELDS = 0
_update = Fm.ConfigForm.update_devices
Fm.ConfigForm.update_devices = lambda self: _update(self) if "f-devices-procs" in self._w else None
'''
_RUN = "\nfrom app.main import TorchdeckApp\nTorchdeckApp().run()\n"
VARIANTS = {"plain": "", "one-line keys": _KEYS, "no fields": _NO_FIELDS, "no fields + one-line keys": _NO_FIELDS + _KEYS}


def run(reps: int = 7) -> dict:
    tmp = C.tmpdir("first_frame_parts")
    env = F._env(tmp)
    (tmp / "hello.py").write_text(F.HELLO)
    cases = {"hello world": ([sys.executable, str(tmp / "hello.py")], "Hello,world!")}
    for i, (name, patch) in enumerate(VARIANTS.items()):
        script = tmp / f"variant{i}.py"
        script.write_text(patch + _RUN)
        cases[name] = ([sys.executable, str(script)], "Launch")
    for argv, marker in cases.values():  # warm the file cache and the bytecode
        F.frame_time(argv, marker, env)
    times = C.alternate(reps, *[(lambda a=a, m=m: F.frame_time(a, m, env)) for a, m in cases.values()])
    hello = C.median(times[0])
    out = {name: {"median_s": C.median(t), "ratio": C.median(t) / hello, "runs_s": t} for name, t in zip(cases, times)}
    for name, r in out.items():
        print(f"{name:28s} {r['median_s']:.3f} s  {r['ratio']:.2f}x  ({' '.join(f'{x:.3f}' for x in r['runs_s'])})")
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
