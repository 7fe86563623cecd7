// SPDX-License-Identifier: Apache-2.0
//! A minimal epoll over the C library's own functions (no `libc` crate):
//! what a VMM's event loop does with a queue's eventfd. Shared by the
//! tests and the virtio_blk example.
#![allow(dead_code)]
use std::io;
use std::os::raw::c_int;
use std::os::unix::io::RawFd;

/// `struct epoll_event`: packed on x86-64 only, as the kernel has it.
#[cfg_attr(target_arch = "x86_64", repr(C, packed))]
#[cfg_attr(not(target_arch = "x86_64"), repr(C))]
#[derive(Copy, Clone)]
pub struct EpollEvent {
    pub events: u32,
    pub data: u64,
}

extern "C" {
    fn epoll_create1(flags: c_int) -> c_int;
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut EpollEvent) -> c_int;
    fn epoll_wait(epfd: c_int, events: *mut EpollEvent, maxevents: c_int, timeout: c_int) -> c_int;
    fn close(fd: c_int) -> c_int;
}

const EPOLL_CLOEXEC: c_int = 0o2000000;
const EPOLL_CTL_ADD: c_int = 1;
/// Readable.
pub const EPOLLIN: u32 = 0x001;

/// An epoll instance, closed on drop.
pub struct Epoll {
    fd: RawFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain system call.
        let fd = unsafe { epoll_create1(EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll { fd })
    }

    /// Watches `fd` for reading; events carry `token`.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = EpollEvent { events: EPOLLIN, data: token };
        // SAFETY: `ev` is valid for the call.
        if unsafe { epoll_ctl(self.fd, EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` (-1: forever) and returns the tokens of
    /// the ready descriptors (none on EINTR or timeout).
    pub fn wait(&self, tokens: &mut Vec<u64>, timeout_ms: i32) -> io::Result<()> {
        let mut events = [EpollEvent { events: 0, data: 0 }; 8];
        tokens.clear();
        // SAFETY: `events` holds 8 entries.
        let n = unsafe { epoll_wait(self.fd, events.as_mut_ptr(), 8, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
        }
        for ev in &events[..n as usize] {
            tokens.push(ev.data);
        }
        Ok(())
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor.
        unsafe { close(self.fd) };
    }
}
