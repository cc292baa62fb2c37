"""elasticrun's integrations with training libraries (flash commits): each imports its
library only when it is imported; none is a dependency of elasticrun."""
