"""What lbctl keeps on a node besides the files it renders: what it owns, when it
last applied, the file as applied, the drains, and the lock that serialises them."""
