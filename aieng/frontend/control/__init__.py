"""Operating the frontend: the admin socket, the client-side ops (health, models, stats), the workers view."""
