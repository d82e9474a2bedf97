"""Long-running fuzz campaigns: a supervisor that owns the run directory and one worker process per GPU.

`flashcheck campaign` (``cli/campaign_cmd.py``) is the entry point; `supervisor.Supervisor` runs it, `worker`
is the process that drives the target, `store.CampaignStore` keeps everything durable, `ledger` quarantines known
crashers and `checks` holds FC251 (worker-crashed). Nothing here imports torch except the worker, lazily.
"""
