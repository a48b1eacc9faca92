"""The HTTP side: metrics server, API, fleet page and the actions behind them."""
