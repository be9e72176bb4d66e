"""Where F5 sends the form: this host (a run started here) or SLURM (a job submitted from here).

SLURM's partitions come from sinfo, asked in a thread after the first frame (`probe`); until they
come, and on a host without SLURM, the partition list holds the cluster's default only and the
where choice says why SLURM is not offered. Mixed into ConfigForm."""
from __future__ import annotations

from .fields import BY_PATH, CHOICE_LABELS, CUSTOM, WHERE, WHERE_CHOICES

DEFAULT = "cluster default"


def probe() -> tuple[list, str]:
    """(SLURM's partitions, "") where sbatch can be used from here, else ([], why not). Runs
    sinfo: call it off the UI thread."""
    import shutil

    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return [], "no sinfo/sbatch on PATH: not a SLURM login node"
    try:
        from ...engine.slurm import cluster
    except ImportError as exc:
        return [], f"this torchdeck has no SLURM support ({exc})"
    try:
        return list(cluster.partitions()), ""
    except Exception as exc:  # SlurmError (its message), or a timeout: said, never raised
        return [], f"sinfo failed: {exc}"


def partition_label(p) -> str:
    """A partition as the list shows it: its name, node count and time limit."""
    facts = [f"{n} nodes" if isinstance(n := getattr(p, "nodes", None), int) else "",
             str(getattr(p, "max_time", "") or "")]
    facts = [f for f in facts if f]
    return f"{p.name} ({', '.join(facts)})" if facts else str(p.name)


class WhereField:
    """The where choice and the partition list built from sinfo's answer."""

    where_initial = "host"  # where's value until its Select is mounted
    slurm_partitions: list = []
    slurm_why: str | None = None  # None: not asked yet; "": SLURM can be used; else why not

    def choice_label(self, choice: str) -> str:
        """How a Select shows one of its choices (SLURM says why it cannot be used here)."""
        if choice == CUSTOM:
            return "custom…"
        if choice == "slurm" and self.slurm_why:
            return f"{CHOICE_LABELS[choice]} (unavailable: {self.slurm_why})"
        return CHOICE_LABELS.get(choice, choice)

    def partition_options(self, value: str) -> list[tuple[str, str]]:
        default = next((p.name for p in self.slurm_partitions if getattr(p, "default", False)), "")
        opts = [(f"{DEFAULT} ({default})" if default else DEFAULT, "")]
        opts += [(partition_label(p), p.name) for p in self.slurm_partitions]
        if value and value not in [v for _, v in opts]:
            opts.append((f"{value} (not in sinfo)" if self.slurm_partitions else value, value))
        return opts

    def set_slurm(self, partitions: list, why: str) -> None:
        """sinfo's answer: the partition list, and the where choice's words for SLURM."""
        self.slurm_partitions, self.slurm_why = list(partitions), why
        if any(not self._w[BY_PATH[p].wid].children for p in (WHERE, "slurm.partition")
               if p in BY_PATH and p in self._mounted_paths):
            # mounted this turn, its own parts (the option list) not yet: set_options would fail on
            # them (NoMatches SelectOverlay, at start-up once), so put the answer in a refresh later
            self.call_after_refresh(self.slurm_again)
            return
        if WHERE in self._mounted_paths:
            where = self._w[BY_PATH[WHERE].wid]
            value = where.value
            if value not in WHERE_CHOICES:  # mounted this turn: its value is not set yet (Select.NULL)
                value = self.where_initial
            where.set_options([(self.choice_label(c), c) for c in WHERE_CHOICES])
            where.value = value
        self.show_partition(self.value_of("slurm.partition") if "slurm.partition" in BY_PATH else "")

    def slurm_again(self) -> None:
        """sinfo's answer put into widgets mounted since: it can arrive while their section is being
        mounted, when set_slurm found them not mounted yet (the partition list stayed empty)."""
        if self.slurm_why is not None:
            self.set_slurm(self.slurm_partitions, self.slurm_why)

    def show_partition(self, value) -> None:
        """Put `value` into the partition list (a partition sinfo does not know is kept, and named)."""
        f = BY_PATH.get("slurm.partition")
        if f is None or not self._mounted(f):
            return
        w = self._w[f.wid]
        w.set_options(self.partition_options(value or ""))
        w.value = value or ""

    @property
    def to_slurm(self) -> bool:
        return self.value_of(WHERE) == "slurm"
