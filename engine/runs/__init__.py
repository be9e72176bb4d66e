"""The run seen from outside, UI-free and torch-free: the reducer of its events (`view`), the
follower of a live run (`follow`), the catalog of runs (`catalog`), control (`control`: start,
stop, kill, wait), compare and tune. `torchdeck run/attach/runs`, the Monitor and the Runs screen
render this; none of them writes into it. The run directory itself (layout, status, stacks) is a
floor below, in engine/rundir/.
"""
