"""The HTTP/1.1 server both HTTP ports run on: ``message`` (llhttp parsing and request limits),
``server`` (asyncio connections and their bounds), ``fair`` (those bounds shared between client
addresses), ``thread`` (a server on a thread of its own, for a
process whose main loop is not asyncio)."""
