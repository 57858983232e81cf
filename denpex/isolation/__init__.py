"""Safe node isolation: decide (plan, gates), approve, act (Slurm over SSH, Kubernetes), audit.

Modules, in the order a plan flows through them:

- ``policy``: the remediation policy (evidence rule, limits, approval, steps); ``runbook`` loads it,
  with its ``workflow_section`` (the incident flow's waits and retries).
- ``facts``: what the scheduler says about its nodes; ``slurm_parse`` reads ``scontrol``/``squeue``.
- ``gates`` and ``planner``: ``plan_isolation`` decides, never acts; ``plan`` is the plan model.
- ``breaker``: the persisted blast-radius circuit breaker.
- ``approval``: a person's consent to one operation (isolate, rollback, requeue) on one plan hash,
  signed (cli-signed) or through the Prefect UI; ``operator``: the trusted configuration (runbook,
  approvers' keys, the machine-wide state directory).
- ``run``: the one way to execute. ``run.open_cluster`` opens the operator's configuration and
  the adapter once; ``run.execute`` (dry run unless told EXECUTE), the one entry point of the CLI
  and the flow, re-checks the plan against the operator's policy and the approval, then its
  executor re-checks on live facts, acts once per node, verifies, audits; ``adapter`` is the
  interface it needs, ``slurm`` (over ``ssh``) and ``kubernetes`` implement it.
- ``audit``: the hash-chained, HMAC-keyed JSON-lines audit log.
- ``config``: SSH / cluster / store settings; ``approval_file`` and ``execution_text``: a plan's
  approval file and an execution report's text, for the CLI (``denpex.cli.isolation``).
"""
