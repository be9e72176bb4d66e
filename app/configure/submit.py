"""F5 with where SLURM: the form submitted as a SLURM job (engine.slurm.submit), then watched in the
Monitor from the moment SLURM has it. sinfo and sbatch run in a thread: a slow controller never
freezes the form. Mixed into ConfigureScreen (through RunActions)."""
from __future__ import annotations

from textual import work

from . import summary
from .fields import BY_PATH


class SlurmSubmit:
    submitting = False  # a submission is on its way: a second F5 waits for it

    def submit_to_slurm(self) -> None:
        if self._refused("submit"):
            return
        if self.submitting:
            self.notify("already submitting this form to SLURM", severity="warning")
            return
        self.submitting = True
        origin = {"preset": self.preset_name or str(self.preset_path or ""),
                  "overrides": summary.overrides(self.form.to_dict(), self.base)}
        self.notify("submitting to SLURM ...")
        self._submit(self.cfg, origin)

    @work(thread=True, exclusive=True, group="slurm-submit")
    def _submit(self, cfg, origin: dict) -> None:
        """What SLURM can be asked before (engine.slurm.submit.check), then sbatch."""
        try:
            from ...engine.slurm import submit

            problems = submit.check(cfg)
            answer = ("refused", problems) if problems else ("submitted", submit.submit(cfg, self.app.runs_root,
                                                                                         origin).path)
        except Exception as exc:  # SlurmError carries SLURM's own words; an OSError its path
            answer = ("failed", [str(getattr(exc, "message", None) or exc)])
        try:
            self.app.call_from_thread(self._submitted, *answer)
        except RuntimeError:
            pass  # the app is gone

    def _submitted(self, outcome: str, got) -> None:
        self.submitting = False
        if outcome == "submitted":
            self.opened(got)
            return
        verb = "Cannot submit" if outcome == "refused" else "SLURM refused the job"
        self.notify("\n".join(f"{verb}: {p}" for p in got), severity="error", timeout=10)
        field = got[0].split(":", 1)[0] if got else ""
        if field in BY_PATH:  # check's lines start with the setting to change
            self._focus_field(field)
        else:
            self._focus_field("where")
