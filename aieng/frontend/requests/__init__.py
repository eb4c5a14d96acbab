"""A client request from admission to its answer: the request table, the stage router (pipeline), model
pipelines (fanout), client accounting, the response cache, breakers and degradation."""
