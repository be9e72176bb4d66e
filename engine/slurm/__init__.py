"""SLURM: a run as a batch job with one torchdeck supervisor per node (issue 38).

    script.py   batch_script(cfg, run_dir): the sbatch script that is submitted (and `export --sbatch` prints)
    node.py     python -m torchdeck.engine.slurm.node RUN_DIR: what srun starts on each node of the job
    cluster.py  sbatch, squeue, scontrol, sinfo from the login node
    submit.py   check and submit a run: its run directory, job.sbatch, slurm.json

What runs where: the batch script runs on the job's first node; srun starts node.py once per node
(SLURM_NODEID is the node rank, the first host of SLURM_JOB_NODELIST is node 0), which runs that
node's supervisor in the foreground, so SLURM tracks, signals and ends it. Node 0 writes the run
directory made at submission, node k writes RUN_DIR/node<k>/; the node link brings every node's
events to node 0. No torch here.
"""
