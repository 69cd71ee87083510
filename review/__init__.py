"""Review tools around a plan, run at a desk: the `python -m stacks` CLI, diff, replacement matrix, rollback,
preview summary, the config reference and the model and image card writers. The tools that keep a deployed
stack serving (watch unit, group supervisor) are in `heal/`."""
