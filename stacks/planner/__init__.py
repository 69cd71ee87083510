"""The planner: a typed stack config in, a launch plan out. Pure; imports stacks.model only."""
