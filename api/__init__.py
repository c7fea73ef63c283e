"""The OpenAI-compatible HTTP API that `barge serve` runs: the Files and Batches
endpoints, on top of `jobs` like any other client (a batch is a job)."""
