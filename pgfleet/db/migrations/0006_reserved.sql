-- pgfleet 0006: reserved for issue 24 (flow control), which lands its own 0006.
-- This branch (issue 26) ships 0007 and needs the numbers contiguous until then:
-- delete this file when merging issue 24's 0006.
SELECT 1;
