"""One job's own concepts, each with one owner: its files (``paths``), its typed events
(``events``), the queries over its event store (``store``) and its batch script
(``script``). Everything here is small and imports little: the prolog loads it on every
job's start path.
"""
