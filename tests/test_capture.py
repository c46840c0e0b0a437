"""Which failed requests of a lab load the VIP's move cut in two, read from
a capture of the LAN as tcpdump prints it (-e -n -tt)."""

from lbctl.lab.capture import split_by_a_move

CLIENT, LB1, LB2, PI1 = "192.168.100.254", "5e:34:a5:96:be:7a", "0e:1a:ae:6b:fe:1c", \
    "8e:3a:86:d7:19:22"
C_MAC = "2a:72:b4:71:9e:d8"


def sent(when, to, port, flags, length=74):
    return (f"{when} {C_MAC} > {to}, ethertype IPv4 (0x0800), length {length}: "
            f"{CLIENT}.{port} > 192.168.100.10.80: Flags [{flags}], seq 1, win 502, length 0\n")


def failed(port, start=1041.0, end=1046.0):
    return [start, end, False, f"error: request from port {port}: TimeoutError: timed out"]


CAPTURE = [
    # 48716: its SYN to lb1, which sent it on to pi1; then lb2 took the VIP,
    # and the client's ACK and request went to lb2.
    sent("1041.37", LB1, 48716, "S"),
    f"1041.38 {LB1} > {PI1}, ethertype IPv4 (0x0800), length 74: {CLIENT}.48716 > "
    "192.168.100.10.80: Flags [S], seq 1, win 64240, length 0\n",
    f"1041.39 {PI1} > {C_MAC}, ethertype IPv4 (0x0800), length 74: 192.168.100.10.80 > "
    f"{CLIENT}.48716: Flags [S.], seq 2, ack 2, win 65160, length 0\n",
    sent("1041.79", LB2, 48716, "."),
    sent("1041.80", LB2, 48716, "P.", 106),
    f"1042.41 {LB2} > {LB1}, ethertype IPv4 (0x0800), length 46: 192.168.100.5 > "
    "192.168.100.2: VRRPv3, Advertisement, vrid 175, prio 100, intvl 100cs, length 12\n",
    # 50000: all of it to lb2, and it still failed: not the move's doing.
    sent("1043.00", LB2, 50000, "S"),
    sent("1043.01", LB2, 50000, "."),
    # 50001: its SYN to lb1 and nothing after (it never got an answer).
    sent("1043.10", LB1, 50001, "S"),
]


def test_a_request_whose_syn_went_to_one_balancer_and_the_rest_to_the_other_was_cut():
    records = [failed(48716), failed(50000), failed(50001)]
    assert split_by_a_move(CAPTURE, records, CLIENT, {LB1, LB2}) == [records[0]]


def test_a_request_that_failed_to_connect_or_went_elsewhere_is_not_the_moves_doing():
    no_port = [1041.0, 1046.0, False, "error: connect: TimeoutError: timed out"]
    assert split_by_a_move(CAPTURE, [no_port], CLIENT, {LB1, LB2}) == []
    # A MAC that is not a balancer's (a worker's) is no move between balancers.
    assert split_by_a_move(CAPTURE, [failed(48716)], CLIENT, {LB1, PI1}) == []


def test_a_port_used_again_later_is_judged_by_its_own_time():
    # 48716 again at 1300, all of it to lb2, and failed: not the move's doing,
    # though the same port's handshake was cut at 1041.
    later = CAPTURE + [sent("1300.00", LB2, 48716, "S"), sent("1300.01", LB2, 48716, ".")]
    first, second = failed(48716), failed(48716, 1299.9, 1305.0)
    assert split_by_a_move(later, [second], CLIENT, {LB1, LB2}) == []
    assert split_by_a_move(later, [first, second], CLIENT, {LB1, LB2}) == [first]
