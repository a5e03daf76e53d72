"""Numbers of the capture formats: pcap and pcapng magic, block types, link types, TCP/IP.

The one source of these values for the reader and the writer (libpcap file format,
pcapng: IETF draft-ietf-opsawg-pcapng; LINKTYPE_* values of the tcpdump.org registry;
Ethertypes of IEEE 802; TCP flags of RFC 9293 §3.1).
"""

from __future__ import annotations

# ---- classic pcap --------------------------------------------------------------------

PCAP_MAGIC_US = 0xA1B2C3D4
"""Classic pcap, microsecond timestamps (either byte order in the file)."""
PCAP_MAGIC_NS = 0xA1B23C4D
"""Classic pcap, nanosecond timestamps."""
PCAP_VERSION = (2, 4)
PCAP_FILE_HEADER_LEN = 24
PCAP_RECORD_HEADER_LEN = 16
MAXIMUM_SNAPLEN = 262144
"""libpcap's largest snapshot length; also the record limit of a file declaring less."""
MAX_RECORD_LEN = 64 << 20
"""No record or block is longer than this: a larger length field is corruption, and the
reader never buffers more than this for one record."""

# ---- pcapng ----------------------------------------------------------------------------

PCAPNG_SHB = 0x0A0D0D0A
"""Section Header Block type (the same bytes in both byte orders)."""
PCAPNG_BOM = 0x1A2B3C4D
PCAPNG_IDB = 0x00000001
PCAPNG_PB = 0x00000002  # obsolete Packet Block
PCAPNG_SPB = 0x00000003
PCAPNG_EPB = 0x00000006
PCAPNG_OPT_END = 0
PCAPNG_OPT_TSRESOL = 9
PCAPNG_BLOCK_MIN_LEN = 12
"""Block type, block length and the trailing copy of the length."""

# ---- link-layer header types (LINKTYPE_* as stored in files) ---------------------------

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW_12 = 12  # DLT_RAW on some BSDs
LINKTYPE_RAW_14 = 14
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
LINKTYPES_RAW_IP = frozenset(
    {LINKTYPE_RAW, LINKTYPE_RAW_12, LINKTYPE_RAW_14, LINKTYPE_IPV4, LINKTYPE_IPV6}
)
SUPPORTED_LINKTYPES = LINKTYPES_RAW_IP | {
    LINKTYPE_NULL,
    LINKTYPE_ETHERNET,
    LINKTYPE_LOOP,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
}
LINKTYPE_MASK = 0x0FFFFFFF
"""The link type of a pcap header's ``network`` field (the top bits carry FCS info)."""

ETHERNET_HEADER_LEN = 14
VLAN_TAG_LEN = 4
LINUX_SLL_HEADER_LEN = 16
LINUX_SLL2_HEADER_LEN = 20
NULL_HEADER_LEN = 4
NULL_AF_INET = 2
NULL_AF_INET6 = frozenset({24, 28, 30, 10})
"""AF_INET6 of the BSDs, macOS and Linux as a loopback/null header stores it."""

# ---- Ethernet, IP, TCP -----------------------------------------------------------------

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_IPV6 = 0x86DD
ETHERTYPE_VLAN = frozenset({0x8100, 0x88A8, 0x9100})
IPPROTO_TCP = 6
IPV4_HEADER_LEN = 20
IPV4_NO_OPTIONS = 0x45
"""Version/IHL byte of an IPv4 header without options."""
IPV4_DONT_FRAGMENT = 0x4000
IPV4_FRAGMENT_MASK = 0x3FFF
"""More-fragments flag and fragment offset: non-zero in every fragment."""
IPV6_HEADER_LEN = 40
IPV6_EXT_HEADERS = frozenset({0, 43, 60, 51})  # hop-by-hop, routing, dest opts, AH
IPV6_AH = 51
IPV6_FRAGMENT = 44
TCP_HEADER_LEN = 20

TCP_FIN = 0x01
TCP_SYN = 0x02
TCP_RST = 0x04
TCP_PSH = 0x08
TCP_ACK = 0x10
