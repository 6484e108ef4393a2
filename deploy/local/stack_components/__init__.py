"""The local stack's parts (deploy/local/stack.py runs them): what every component
shares (``base``), and one module per component."""
