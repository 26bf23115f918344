//! A TCP proxy the outage tests cut and restore.

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy in front of a service (PostgreSQL, the schema registry) that can be taken down
/// and brought back.
pub struct Proxy {
    pub port: u16,
    down: watch::Sender<bool>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (down, _) = watch::channel(false);
        let is_down = down.subscribe();
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { continue };
                let mut is_down = is_down.clone();
                if *is_down.borrow_and_update() {
                    continue; // dropped: closed at once
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = is_down.wait_for(|down| *down) => {}
                    }
                });
            }
        });
        Self { port, down }
    }

    /// Takes the service away (every connection closed, new ones refused) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }
}
