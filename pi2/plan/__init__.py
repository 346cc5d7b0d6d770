"""pi2.plan — the planner's inputs and choices: the device read-throughput profile (profile.py) first."""
