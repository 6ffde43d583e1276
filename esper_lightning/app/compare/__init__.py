"""``esper-lightning compare``: controllers played on the same episodes, judged with paired stats.

`runner` plays the episodes (`Comparison`); `arms` is the registry of what ``--controllers``
names; `records` holds the metrics and the CSV table; `stats`, `report`, `regret` and `speedup`
turn the table into intervals, verdicts and tables; `plots` draws them.
"""
