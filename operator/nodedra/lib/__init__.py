"""What every layer of nodedra uses and none owns: quantities, durable files, crash points.

Nothing here imports anything else of nodedra, so any layer may import it.
"""
