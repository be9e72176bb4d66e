"""The live summary: what the run will be (processes, world, global batch, devices) and the
headless command that launches the same thing. Plain functions so they are easy to test."""
from __future__ import annotations

import shlex

from .fields import flatten, override_text
from ...engine.config import RunConfig
from ...engine.kinds import kind_of


def problems_line(problems: dict[str, str], most: int = 4) -> str:
    """What is wrong, for the summary: the count, the first problem with its reason, and the
    fields of the others by name (past `most` of them, how many more), so the count and the
    names always agree."""
    items = [(k or "preset", v) for k, v in problems.items()]
    n = len(items)
    text = f"{n} problem{'s' if n != 1 else ''}: {items[0][0]}: {items[0][1]}"
    rest = [k for k, _ in items[1:]]
    if rest:
        named = rest if len(rest) <= most else rest[:most - 1]
        more = len(rest) - len(named)
        text += "\nalso " + ", ".join(named) + (f" and {more} more" if more else "")
    return text


def count(n: int) -> str:
    """A count as people read it: 6,336. engine.fmt writes every number; under 1,000 it adds
    nothing, and importing it (with engine.runs, ~5 ms) is kept off the first frame then."""
    if abs(n) < 1000:
        return str(n)
    from ...engine import fmt

    return fmt.num(n, ",")


def rank_devices(cfg: RunConfig) -> list[list[str]]:
    """Devices each local rank uses, as the strategy sees it."""
    from ...engine.strategies import get_strategy, nproc_per_node

    strat = get_strategy(cfg.strategy)
    return [strat.local_devices(cfg, r) for r in range(nproc_per_node(cfg))]


def describe(cfg: RunConfig) -> str:
    """One line: processes, world size, global batch, devices per rank."""
    if kind_of(cfg).is_script:
        return describe_script(cfg)
    per_rank = rank_devices(cfg)
    if len(per_rank) <= 4:
        devs = "  ".join(f"r{r}:{','.join(d)}" for r, d in enumerate(per_rank))
    else:  # many ranks: say the pattern, not every rank
        devs = f"r0:{','.join(per_rank[0])} … r{len(per_rank) - 1}:{','.join(per_rank[-1])}"
    from ...engine.strategies import global_batch, world_size

    n = len(per_rank)
    nodes = ""
    if cfg.nodes.num_nodes > 1:  # global rank = node_rank x nproc_per_node + local rank (torchrun's rule)
        first = cfg.nodes.node_rank * n
        mine = f"rank {first}" if n == 1 else f"ranks {first}-{first + n - 1}"
        nodes = f" x {cfg.nodes.num_nodes} nodes (this is node {cfg.nodes.node_rank}: {mine})"
    accum = f" (x{cfg.train.grad_accum} accum)" if cfg.train.grad_accum > 1 else ""
    return (f"{n} process{'es' if n != 1 else ''}{nodes} · world {world_size(cfg)} · "
            f"global batch {count(global_batch(cfg))}{accum} · {devs}\n{data_line(cfg)}")


def data_line(cfg: RunConfig) -> str:
    """Where the data lives during the run: decoded in RAM within the node's budget, or streamed."""
    from ...engine.cache import plan
    from ...engine.strategies import nproc_per_node

    return plan(cfg, nproc_per_node(cfg)).line


def describe_lines(cfg: RunConfig, most_ranks: int = 8) -> list[str]:
    """The same facts one per line, for the side panel of a wide terminal (plain text)."""
    if kind_of(cfg).is_script:
        return script_lines(cfg)
    from ...engine.strategies import global_batch, nproc_per_node, world_size

    n, nodes, world = nproc_per_node(cfg), cfg.nodes.num_nodes, world_size(cfg)
    first = cfg.nodes.node_rank * n  # global rank = node_rank x nproc_per_node + local rank
    lines = [f"{n} process{'es' if n != 1 else ''}"
             + (f" x {nodes} nodes (this is node {cfg.nodes.node_rank})" if nodes > 1 else ""),
             f"world size {world}",
             f"global batch {count(global_batch(cfg))} = {count(cfg.train.batch_size)} x {world}"
             + (f" x {cfg.train.grad_accum} accum" if cfg.train.grad_accum > 1 else "")]
    per_rank = rank_devices(cfg)
    shown = per_rank if len(per_rank) <= most_ranks else per_rank[:most_ranks - 1]
    lines += [f"rank {first + r}: {','.join(d)}" for r, d in enumerate(shown)]
    if len(shown) < len(per_rank):
        lines.append(f"… rank {first + n - 1}: {','.join(per_rank[-1])}")
    return lines + [data_line(cfg)]  # the one-line summary is hidden while this panel shows


# ----------------------------------------------------------------------------- a script run
# The loop's facts (global batch, data, epochs) are the script's own business: a script run's
# summary is what torchdeck decides for it, the command each rank runs, its processes and threads.


def script_command(cfg: RunConfig) -> str:
    """The command each rank runs, as the user would type it (the shim around it left out)."""
    from ...engine.launch.ranks import command

    return shlex.join(str(a) for a in command(cfg.script))


def script_facts(cfg: RunConfig) -> dict:
    """processes, nodes, world, threads per rank, devices, the folder, the stop grace."""
    from ...engine.affinity import threads_for
    from ...engine.preflight import script_cwd
    from ...engine import fmt
    from ...engine.strategies import nproc_per_node, world_size

    n = nproc_per_node(cfg)
    first = cfg.nodes.node_rank * n  # global rank = node_rank x nproc_per_node + local rank
    import os

    from ...engine.launch.env import threads_of

    # script.env's OMP_NUM_THREADS, else the one exported to the app (kept, as torchrun keeps it), else the plan
    threads = str(threads_of(cfg.script.env, os.environ, threads_for(cfg, n)))
    per_rank = rank_devices(cfg)
    return {"n": n, "nodes": cfg.nodes.num_nodes, "world": world_size(cfg), "threads": threads,
            "devices": fmt.rank_groups([(first + r, ",".join(d)) for r, d in enumerate(per_rank)]),
            "cwd": str(script_cwd(cfg)), "grace": f"{cfg.script.stop_grace_s:g}"}


def describe_script(cfg: RunConfig) -> str:
    f = script_facts(cfg)
    nodes = f" x {f['nodes']} nodes (this is node {cfg.nodes.node_rank})" if f["nodes"] > 1 else ""
    return (f"{f['n']} process{'es' if f['n'] != 1 else ''}{nodes} · world {f['world']} · "
            f"{f['threads']} thread{'s' if f['threads'] != '1' else ''}/rank · {f['devices']}\n"
            f"each rank runs: {script_command(cfg)}")


def script_lines(cfg: RunConfig) -> list[str]:
    f = script_facts(cfg)
    s = cfg.script
    lines = [f"your script: {script_command(cfg)}", f"in {f['cwd']}",
             f"{f['n']} process{'es' if f['n'] != 1 else ''}"
             + (f" x {f['nodes']} nodes (this is node {cfg.nodes.node_rank})" if f["nodes"] > 1 else ""),
             f"world size {f['world']}", f"threads/rank {f['threads']} (OMP_NUM_THREADS)", f["devices"]]
    if s.env:
        lines.append("environment: " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in s.env.items()))
    return lines + [f"stop: SIGTERM, SIGKILL after {f['grace']} s"]


def overrides(current: dict, base: dict) -> list[str]:
    """`key=value` for every setting that differs from the loaded preset. An emptied description is
    left out: it changes nothing a run does (switching to a script empties the loop preset's words)
    and `--set 'description=""'` only lengthens the command."""
    cur, ref = flatten(current), flatten(base)
    out = []
    for key, value in cur.items():
        if key == "schema_version" or (key == "description" and not value):
            continue
        if key not in ref or ref[key] != value:
            out.append(f"{key}={override_text(value)}")
    return out


def headless_command(preset: str, current: dict, base: dict, slurm: bool = False) -> str:
    """The command line that starts the form without the app (submits it, for where SLURM)."""
    parts = ["torchdeck", "run", shlex.quote(preset)] + (["--slurm"] if slurm else [])
    for item in overrides(current, base):
        parts += ["--set", shlex.quote(item)]
    return " ".join(parts)
