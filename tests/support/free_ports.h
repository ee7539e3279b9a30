// A run of TCP ports on the loopback interface that nobody listens on now, for tests that start
// servers on fixed ports (a KV transfer server binds kv_port + rank).
#pragma once

namespace pagoda::testing {

// A base port whose next `n` ports could all be bound a moment ago. Drawn below Linux's ephemeral
// range (32768 and up), so that the connections other tests open meanwhile do not take one of
// them; 0 when none was found.
int free_tcp_ports(int n = 1);

}  // namespace pagoda::testing
