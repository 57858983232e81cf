"""Safe node isolation: decide (plan, gates), approve, act (Slurm over SSH, Kubernetes), audit.

Modules, in the order a plan flows through them:

- ``policy``: the remediation policy (evidence rule, limits, approval, steps); ``runbook`` loads it.
- ``facts``: what the scheduler says about its nodes; ``slurm_parse`` reads ``scontrol``/``squeue``.
- ``gates`` and ``planner``: ``plan_isolation`` decides, never acts; ``plan`` is the plan model.
- ``breaker``: the persisted blast-radius circuit breaker.
- ``approval``: a person's consent to one operation (isolate or rollback) on one plan hash.
- ``executor``: re-checks on live facts, acts once per node, verifies, audits; ``adapter`` is the
  interface it needs, ``slurm`` (over ``ssh``) and ``kubernetes`` implement it.
- ``audit``: the hash-chained JSON-lines audit log.
- ``config``: SSH / cluster / store settings; ``commands``: the CLI commands.
"""
