//! One shutdown signal for every task: a trigger and cheap, cloneable waiters.

use tokio::sync::watch;

pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

#[derive(Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    pub fn subscribe(&self) -> Shutdown {
        Shutdown {
            rx: self.tx.subscribe(),
        }
    }
}

impl Shutdown {
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once shutdown is triggered (or the trigger is gone).
    pub async fn wait(&mut self) {
        let _ = self.rx.wait_for(|stop| *stop).await;
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn every_waiter_wakes_on_trigger() {
        let (trigger, a) = super::channel();
        let mut b = a.clone();
        let mut a = a;
        assert!(!a.is_triggered());
        let waiter = tokio::spawn(async move { b.wait().await });
        trigger.trigger();
        a.wait().await;
        waiter.await.unwrap();
        assert!(a.is_triggered());
    }
}
