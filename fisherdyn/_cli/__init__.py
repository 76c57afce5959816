from ._main import main as main
