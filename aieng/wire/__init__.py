"""What crosses a process boundary: the typed messages, the client protocol, shared-memory rings and their
sizing, addresses and the express lane."""
