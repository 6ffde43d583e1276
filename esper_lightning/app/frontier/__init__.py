"""The compute-optimal frontier: fixed sizes and growing arms on one loss-against-FLOPs chart.

`plan` (a study's arms, budgets, rates, episodes; torch-free), `arms` (the arms by name),
`train` (one unit: branched cooldowns of a fixed size), `study` (a plan's units, resumably on
worker processes).
"""
