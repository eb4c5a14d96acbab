"""Which version answers: routing (weights, rules, groups), the rollout state and its file (routestore, the
writer thread), canary auto-rollback, shadow traffic and its mirror."""
