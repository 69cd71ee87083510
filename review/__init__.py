"""Review tools around a plan: CLI, diff, replacement matrix, rollback, preview summary, units."""
