//! A network of the projector's own, to cut: a network namespace linked to the host by two
//! veth pairs, one carrying its broker connections and the other its PostgreSQL ones. A
//! forwarder (scripts/services/forward.py) at each end carries them: inside the namespace
//! it listens where the projector connects (the broker's and PostgreSQL's loopback addresses,
//! so the broker's advertised address works unchanged), on the host it reaches the real
//! services. Taking a link's host end down cuts that service off: the connections stay open
//! and silent, as in a real partition, until the link is up again.

use std::process::{Child, Command, Stdio};

/// Which service a link carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Broker,
    Postgres,
}

/// The namespace, its links and its forwarders (their pids recorded); removed on drop.
pub struct Net {
    pub namespace: String,
    links: [String; 2],
    forwarders: Vec<Child>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).stderr(Stdio::piped()).output().map_err(|e| format!("ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
    }
}

impl Net {
    /// Sets it up, forwarding `broker` and `postgres` (`host:port` each, loopback); an error
    /// says what this machine lacks (`ip` and network namespaces, python3, root).
    pub fn new(broker: &str, postgres: &str) -> Result<Self, String> {
        let id = std::process::id() % 10_000;
        let namespace = format!("pjchaos{id}");
        let links = [format!("pjk{id}h"), format!("pjp{id}h")];
        let _ = ip(&["netns", "del", &namespace]);
        ip(&["netns", "add", &namespace])?;
        let mut net = Self { namespace, links, forwarders: Vec::new() };
        net.ns(&["link", "set", "lo", "up"])?;
        let subnet = |k: usize| format!("10.25{}.{}", 3 + k, id % 250);
        for (k, host_end) in net.links.clone().iter().enumerate() {
            let inner = format!("{}n", &host_end[..host_end.len() - 1]);
            ip(&["link", "add", host_end, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &inner, "netns", &net.namespace])?;
            ip(&["addr", "add", &format!("{}.1/30", subnet(k)), "dev", host_end])?;
            ip(&["link", "set", host_end, "up"])?;
            net.ns(&["addr", "add", &format!("{}.2/30", subnet(k)), "dev", &inner])?;
            net.ns(&["link", "set", &inner, "up"])?;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/services/forward.py");
        let port = |addr: &str| addr.rsplit_once(':').map(|(_, p)| p.to_owned()).unwrap_or_default();
        let (kafka, pg) = (port(broker), port(postgres));
        let host = [format!("{}.1:{kafka}={broker}", subnet(0)), format!("{}.1:{pg}={postgres}", subnet(1))];
        let inside = [format!("{broker}={}.1:{kafka}", subnet(0)), format!("{postgres}={}.1:{pg}", subnet(1))];
        let spawn = |mut c: Command| c.stdout(Stdio::null()).spawn().map_err(|e| format!("python3: {e}"));
        let mut on_host = Command::new("python3");
        on_host.arg(script).args(&host);
        net.forwarders.push(spawn(on_host)?);
        let mut in_ns = Command::new("ip");
        in_ns.args(["netns", "exec", &net.namespace, "python3", script]).args(&inside);
        net.forwarders.push(spawn(in_ns)?);
        std::thread::sleep(std::time::Duration::from_millis(500));
        Ok(net)
    }

    fn ns(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["-n", self.namespace.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// The status of `GET path` on `addr` inside the namespace (a listener of the projector's
    /// there), `None` when it does not answer within 2 s.
    pub fn http_status(&self, addr: &str, path: &str) -> Option<u16> {
        let code = format!(
            "import urllib.request, urllib.error\n\
             try: print(urllib.request.urlopen('http://{addr}{path}', timeout=2).status)\n\
             except urllib.error.HTTPError as e: print(e.code)"
        );
        let out = Command::new("ip").args(["netns", "exec", &self.namespace, "python3", "-c", &code]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }

    /// Takes `link` down (cut) or up (restored).
    pub fn set(&self, link: Link, up: bool) {
        let host_end = &self.links[if link == Link::Broker { 0 } else { 1 }];
        ip(&["link", "set", host_end, if up { "up" } else { "down" }]).unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for forwarder in &mut self.forwarders {
            let _ = forwarder.kill();
            let _ = forwarder.wait();
        }
        // The namespace's veth ends go with it, and their host ends with them.
        let _ = ip(&["netns", "del", &self.namespace]);
    }
}
