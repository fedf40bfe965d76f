"""What a team builds runs from: model sources, agents, topologies, datasets and environments."""
