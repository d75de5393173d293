"""Pure reward functions of the four methods: parsers, geometry, matching, uncertainty, advantages."""
