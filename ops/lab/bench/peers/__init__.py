"""Other gateways a bank would pick instead of tidegate, run by the overload bench as peer arms."""
