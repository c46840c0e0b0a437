"""A node's status: collected once (collect.py) into one type (model.py), and
shown as text (render.py) or JSON (NodeStatus.to_json)."""
