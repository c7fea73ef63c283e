"""`barge` and its commands: the entry points, on the top floor (docs/architecture.md).

cli.main holds `main()` and the top-level parser; each command group is one module with
`add_commands(commands)`, which adds its commands to `barge`'s subparsers:

    cli/job.py       submit, status, wait, cancel, retry, results, report, jobs
    cli/worker.py    worker, workers
    cli/webhook.py   webhooks ...        cli/secret.py   secrets ...
    cli/schedule.py  schedule ..., beat  cli/quant.py    quantize, eval-quant
    cli/model.py     models ...          cli/serve.py    serve
    cli/api_key.py   api-key ...         cli/cache.py    cache ...
    cli/demo.py      demo

Commands parse arguments and print; the work is in the packages below (jobs, queueing,
api, engine), which import nothing from here.
"""
