"""elasticrun's collectives in the horovod.torch style, one module per kind, each over the
current round's groups (world/): same keywords and results as Horovod, `name=` and
`process_set=`, synchronous, in place or with a handle for `poll`/`synchronize`. A failed peer
raises WorkersFailedError; misuse raises what Horovod raises.

Alongside them: tensor fusion (fusion.py), handles (handles.py), join and the header that
precedes every collective (join.py), Adasum (adasum.py), the host-change vote that rides in
a step's gradients (host_vote.py) and process sets (process_sets.py).
"""
