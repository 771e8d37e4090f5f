import sys
def main(argv=None):
    print("sim ok")
    return 0
