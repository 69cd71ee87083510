"""Keeping a deployed stack serving, from the deploying host: the API watch unit (alerts), the group supervisor
(restarts a dead engine group in order), drift and the access to the nodes both use. Imports the planner and
components; the review tools (`python -m stacks`) import it, never the other way."""
